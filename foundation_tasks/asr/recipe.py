"""asr's tiny recipe for the studies (foundation demo, foundation compare pretraining)."""
from foundation.engine.recipe import Recipe

RECIPE = Recipe(
    task="asr", config="configs/asr/tiny.yaml", metric="wer_test", scale=1, modality="speech", rank=3,
    label="speech recognition (test WER %, held-out voices, lower is better)", data="speech",
    data_field="tasks.asr.data_dir", steps=1400, minutes=6.0, bar="<= 20", baseline="nothing recognised 100",
    # a 24-layer, 32-wide transducer recognises nothing in a short run: the study reads the held-out RNN-T loss
    # per utterance. CTC + transducer from the first step: the divergence rule compares the training loss with
    # the first step's, which a transducer loss switched on mid-run (the recipe's rnnt_start) would trip
    stability_steps=120, stability_overrides=("tasks.asr.rnnt_start=0",), stability_metric="loss",
    # the ladder every rule shares starts at Pre-LN's lr / 3, where it always did (the config's default norm,
    # Magneto, now trains at 8e-3: the ladder would otherwise move up one rung's worth)
    stability_lr=4.0e-3 / 3,
    label_field="tasks.asr.train_fraction", label_budgets=("0.1", "all"),
    label_unit="fraction of the transcribed utterances", pretrainings=("best_rq",),
)
