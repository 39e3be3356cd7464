"""nlvr2's tiny recipe for the studies (foundation demo, foundation compare pretraining)."""
from foundation.engine.recipe import Recipe

RECIPE = Recipe(
    task="nlvr2", config="configs/vl/tiny_nlvr2_{norm}.yaml", metric="accuracy", scale=100, modality="vl", rank=5,
    label="NLVR2 (accuracy %)", data="vl", data_override="tasks.nlvr2.data_dir={root}/nlvr2", steps=400,
    minutes=1.4, baseline="chance 50.0", stability_steps=120,
)
