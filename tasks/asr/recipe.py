"""asr's tiny recipe for the studies (foundation demo, foundation compare pretraining)."""
from foundation.engine.recipe import Recipe

RECIPE = Recipe(
    task="asr", config="configs/asr/tiny_{norm}.yaml", metric="wer_test", scale=1, modality="speech", rank=3,
    label="speech recognition (test WER %, held-out voices, lower is better)", data="speech",
    data_override="tasks.asr.data_dir={root}", steps=1400, minutes=6.0, baseline="nothing recognised 100",
)
