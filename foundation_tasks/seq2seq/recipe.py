"""seq2seq's tiny recipe for the studies (foundation compare stability; no demo data: the task makes its own)."""
from foundation.engine.recipe import Recipe

RECIPE = Recipe(
    task="seq2seq", config="configs/seq2seq/tiny.yaml", metric="exact_match", scale=100, rank=7,
    label="seq2seq reversal (exact match %)",
    # 24L-24L and 48L-48L encoder-decoders (depth = layers of each stack), the config's width 32
    stability_steps=150, stability_depths=(24, 48),
)
