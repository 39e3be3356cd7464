"""nlvr2's tiny recipe for the studies (foundation demo, foundation compare pretraining)."""
from foundation.engine.recipe import Recipe

RECIPE = Recipe(
    task="nlvr2", config="configs/vl/tiny_nlvr2.yaml", metric="accuracy", scale=100, modality="vl", rank=5,
    label="NLVR2 (accuracy %)", data="vl", data_field="tasks.nlvr2.data_dir", data_path="{root}/nlvr2", steps=400,
    minutes=1.0, bar=">= 75", baseline="chance 50.0", stability_steps=120,
    # the statements are balanced (text alone at chance): from scratch it stays at chance for minutes,
    # as real NLVR2 does; BEiT-3 fine-tunes it from a pretrained model, the demo from its VQA runs
    init_from_stage="vqa",
)
