"""vqa's tiny recipe for the studies (foundation demo, foundation compare pretraining)."""
from foundation.engine.recipe import Recipe

RECIPE = Recipe(
    task="vqa", config="configs/vl/tiny_vqa.yaml", metric="vqa_accuracy", scale=100, modality="vl", rank=4,
    label="VQA (accuracy %)", data="vl", data_field="tasks.vqa.data_dir", data_path="{root}/vqa", steps=1500, minutes=3.0,
    bar=">= prior + 20", prior="foundation_tasks.vqa.prior", stability_steps=120,
    label_field="tasks.vqa.train_fraction", label_budgets=("0.1", "all"), label_unit="fraction of the questions",
    pretrainings=("vl",),
)
