"""What a task declares about its tiny recipe for the studies (``foundation_tasks/<task>/recipe.py``).

A task that wants to take part in ``foundation demo``, ``foundation compare pretraining``,
``foundation compare labels`` or ``foundation compare stability`` puts ``RECIPE = Recipe(...)`` in its own ``recipe.py``, next to its configs; the studies find
it by name (``foundation_tasks.<task>.recipe``), so no table elsewhere lists the tasks. Plain data: the
engine itself never reads it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    task: str  # the task package, foundation_tasks/<task>
    config: str  # its tiny config (each run sets backbone.norm)
    metric: str  # eval metric shown in the studies' tables (without "eval/<task id>/")
    scale: float  # shown as metric x scale: 100 for fractions, 1 for values already in % or losses
    modality: str = ""  # the single-modality pretraining run it fine-tunes from (vision, vl, speech); "" = none
    rank: int = 0  # row order in the studies' tables
    # `foundation demo`: a short Pre-LN vs Magneto comparison on the generated demo data
    stage: str = ""  # the demo stage's name ("" = the task's)
    label: str = ""  # the row label of the demo's table
    data: str = ""  # the `foundation data make` data set it reads ("" = none: not in the demo)
    data_field: str = ""  # the config field that takes the data folder, e.g. tasks.vqa.data_dir
    data_path: str = "{root}"  # that folder: {root} = the data set's folder (as its generator declares it)
    steps: int = 0  # training steps of a demo run (0 = not in the demo)
    overrides: tuple[str, ...] = ()  # demo runs: more overrides (e.g. no pretrained weights)
    warmup: float = 0.0  # demo runs warm up for this fraction of their steps (0: the config's warmup_steps)
    minutes: float = 1.0  # how long one demo run takes on one idle core: longest runs start first
    init_from_stage: str = ""  # demo runs start from this stage's run of the same norm and seed (its best model)
    baseline: str = ""  # what the metric is without learning, shown beside it
    prior: str = ""  # a module with ``answer_prior(data_dir) -> fraction``: the baseline computed from the data
    bar: str = ""  # what every demo run must reach, on the shown scale: ">= 85", "<= 20", ">= prior + 20"
    # `foundation compare stability`: a deep, narrow version of the recipe over a ladder of peak lrs.
    # The study sets the depth and a narrow width (studies.stability.NARROW); these refine it.
    stability_steps: int = 0  # training steps of one run (0: the study's default, studies.stability.STEPS)
    stability_overrides: tuple[str, ...] = ()  # more overrides of the deep, narrow runs (batch, width, ...)
    stability_lr: float = 0.0  # the ladder's lowest peak lr (0: the config's optim.lr / 3, studies.stability.LOWEST)
    stability_depths: tuple[int, ...] = ()  # its depths (): the study's (24, 48 where the budget allows)
    stability_metric: str = ""  # the study's metric if not `metric` (same direction), e.g. a loss where a short run cannot reach the metric
    before: tuple[str, ...] = ()  # a run every run needs first (config, overrides with {root} = data folder),
    before_override: str = ""  # trained once per study; this override hands it over ({run} = its run directory)
    # `foundation compare labels`: fine-tuning at label budgets, from scratch and from each named
    # pretraining (studies.labels.PRETRAININGS); () = not in that study
    label_field: str = ""  # the config field of the budget: train_per_class (vision) | train_fraction
    label_budgets: tuple[str, ...] = ()  # the study's budgets, scarcest first; "all" = every label
    label_unit: str = ""  # what a budget counts, for the tables and figures
    pretrainings: tuple[str, ...] = ()  # the one that pays first: --quick takes only the first
    label_steps: int = 0  # fine-tuning steps in every cell (0: the config's own)
    # what a fine-tuning from a pretraining adds to the config (compare labels, compare pretraining), as BEiT's
    # fine-tuning recipes add layer decay to what a from-scratch recipe uses: e.g. ("optim.layer_decay=0.65",)
    pretrained_overrides: tuple[str, ...] = ()

    @property
    def stage_name(self) -> str:
        return self.stage or self.task

    @property
    def metric_key(self) -> str:
        """``metric`` as the runs log it (``<task>/<metric>``): the value every study's table shows."""
        return f"{self.task}/{self.metric}"

    def label_overrides(self, budget: str, seed: int) -> list[str]:
        """A fine-tuning run's label budget ("all" = every label) drawn with ``seed`` (nested subsets: a
        seed's 10 images per class are among its 100), and the steps of ``label_steps``."""
        seed_field = self.label_field.rsplit(".", 1)[0] + ".subset_seed"
        return [f"{seed_field}={seed}", f"{self.label_field}={'null' if budget == 'all' else budget}",
                *([f"train.steps={self.label_steps}"] if self.label_steps else [])]
