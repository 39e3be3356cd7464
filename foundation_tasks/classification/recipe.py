"""classification's tiny recipe for the studies (foundation demo, foundation compare pretraining)."""
from foundation.engine.recipe import Recipe

RECIPE = Recipe(
    task="classification", config="configs/vision/tiny_finetune.yaml", metric="top1", scale=100,
    modality="vision", rank=1,
    stage="vision", label="image classification (top-1 %)", data="vision",
    data_field="tasks.classification.data_dir", steps=750, overrides=("init_from=null",), minutes=2.0,
    # a third of the run warming up (250 of 750 steps), as Magneto's ViT fine-tuning warms up for a fifth (Table 13:
    # 20 of 100 epochs): Magneto seed 1 at 750 steps 78.4 % top-1 with the config's 45, 82.8 with 150, 86.8 with 250
    warmup=1 / 3,
    bar=">= 85", baseline="chance 10.0",
    label_field="tasks.classification.train_per_class", label_budgets=("10", "100", "all"),
    label_unit="labelled images per class", pretrainings=("pixels", "tokens"), label_steps=500,
    stability_steps=160, stability_overrides=("train.batch_size=32",),  # ~30 s a 24-layer run
)
