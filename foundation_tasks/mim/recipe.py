"""mim's tiny recipe for the studies (foundation compare stability; not in the demo: steps=0)."""
from foundation.engine.recipe import Recipe

RECIPE = Recipe(
    task="mim", config="configs/vision/tiny_mim.yaml", metric="mim_acc", scale=100, rank=1,
    label="MIM pretraining (masked visual-token accuracy %)", data="vision",
    data_field="tasks.mim.data_dir",
    # the visual tokenizer its targets come from: trained once per study, its weights handed over
    before=("configs/vision/tiny_tokenizer.yaml", "tasks.vq_tokenizer.data_dir={root}"),
    before_override="tasks.mim.tokenizer={run}/best/model.safetensors",
    stability_steps=100,
)
