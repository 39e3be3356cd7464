"""The training config: one YAML file, checked completely before any work starts.

    run_name: seq2seq-tiny          # run directory: <output_dir>/<run_name>
    backbone: {dim: 32, depth: 2, heads: 4, arch: encoder_decoder}
    tasks:
      - {name: seq2seq, weight: 1.0, problem: reverse}   # + the task's own fields
    optim: {lr: 1.0e-3, layer_decay: 0.75}
    schedule: {name: cosine, warmup_steps: 10}
    train: {steps: 100, batch_size: 32}

Every section is a dataclass below; an unknown key, a wrong type or a bad value raises
``ConfigError`` naming the key. Command-line overrides are dotted ``key=value`` pairs
(``optim.lr=3e-4``, ``tasks.0.problem=sort`` or ``tasks.seq2seq.problem=sort``); ``~key``
deletes a key or a task entry (Hydra's syntax: ``~tasks.speech`` trains without that task).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from omegaconf import DictConfig

from foundation.config import BackboneConfig, ConfigError, apply_override, build, read_yaml, to_dict  # noqa: F401 - apply_override re-exported
from foundation.engine.task import Task, get_task, known_tasks

SCHEDULES = ("cosine", "linear", "poly", "constant")
MIXES = ("sum", "sample", "round_robin")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
STRATEGIES = ("ddp", "fsdp")
DEVICES = ("auto", "cpu", "cuda")


def _check(ok: bool, key: str, value: Any, msg: str) -> None:
    if not ok:
        raise ConfigError(f"field {key!r}: {msg} (got {value!r})")


@dataclass
class OptimConfig:
    """AdamW; ``layer_decay`` d gives layer i of L blocks the lr scale d ** (L + 1 - i)
    (embeddings i = 0, the head i = L + 1), as BEiT does."""

    lr: float = 1e-3  # peak learning rate (after warmup)
    weight_decay: float = 0.05  # never applied to 1-d parameters (biases, norms)
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    layer_decay: Optional[float] = None
    clip_grad: Optional[float] = 1.0  # max global grad norm; null = no clipping
    # the first N steps train only what init_from did not load (the new head): linear probing, then
    # fine-tuning (LP-FT; wav2vec 2.0's freeze_finetune_updates), so that a fresh head's first
    # gradients do not rewrite the pretrained layers. Their Adam moments still follow the gradients.
    # Without init_from nothing is held, so one recipe serves both starts.
    freeze_pretrained_steps: int = 0
    no_weight_decay: List[str] = field(default_factory=list)  # extra fnmatch name patterns

    def __post_init__(self) -> None:
        # inf passes a "> 0" test and turns the weights into NaN at the first step
        _check(math.isfinite(self.lr) and self.lr > 0, "optim.lr", self.lr, "must be a finite number > 0")
        _check(math.isfinite(self.weight_decay) and self.weight_decay >= 0, "optim.weight_decay", self.weight_decay,
               "must be a finite number >= 0")
        _check(math.isfinite(self.eps) and self.eps > 0, "optim.eps", self.eps, "must be a finite number > 0")
        _check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "optim.betas", self.betas,
               "must be two numbers in [0, 1)")
        _check(self.layer_decay is None or 0 < self.layer_decay <= 1, "optim.layer_decay", self.layer_decay,
               "must be in (0, 1]")
        _check(self.clip_grad is None or self.clip_grad > 0, "optim.clip_grad", self.clip_grad, "must be > 0 or null")
        _check(self.freeze_pretrained_steps >= 0, "optim.freeze_pretrained_steps", self.freeze_pretrained_steps,
               "must be >= 0")


@dataclass
class ScheduleConfig:
    """Linear warmup from 0, then ``name`` down to ``min_lr`` at ``train.steps``."""

    name: str = "cosine"  # cosine | linear | poly | constant
    warmup_steps: int = 0
    min_lr: float = 0.0  # absolute, like timm / BEiT (scaled by each group's layer decay)
    power: float = 1.0  # for poly

    def __post_init__(self) -> None:
        _check(self.name in SCHEDULES, "schedule.name", self.name, f"must be one of {', '.join(SCHEDULES)}")
        _check(self.warmup_steps >= 0, "schedule.warmup_steps", self.warmup_steps, "must be >= 0")
        _check(math.isfinite(self.min_lr) and self.min_lr >= 0, "schedule.min_lr", self.min_lr,
               "must be a finite number >= 0")
        _check(math.isfinite(self.power) and self.power > 0, "schedule.power", self.power, "must be a finite number > 0")


@dataclass
class LoopConfig:
    steps: int = 1000  # optimizer steps
    batch_size: int = 32  # per process and micro-step; global = batch_size * processes * grad_accum
    grad_accum: int = 1
    # multi-task: sum = every step one batch of every task, loss = sum of weight * loss;
    # sample = one task per step drawn with probability ~ weight; round_robin = in turn
    mix: str = "sum"
    precision: str = "auto"  # auto (bf16 autocast on CUDA, fp32 on CPU) | fp32 | bf16 | fp16
    strategy: str = "ddp"  # under torchrun: ddp | fsdp (FSDP2 fully_shard per block)
    compile: bool = False  # torch.compile the model
    # deterministic kernels (torch.use_deterministic_algorithms, warn-only): on CUDA the same
    # run twice, or stopped and resumed, gives bit-identical losses and weights; a little slower
    deterministic: bool = False
    ema: Optional[float] = None  # EMA decay of the weights, e.g. 0.9999
    max_nonfinite: int = 10  # stop after this many non-finite steps in a row
    num_workers: int = 0  # DataLoader workers per process
    stop_at: Optional[int] = None  # end this invocation after this step (checkpointed); resume goes on
    # a run whose training loss ends above this x its first step's loss (averaged over the last
    # 5 % of the steps, at least 5) blew up and never came back: it ends "diverged", its last
    # model neither evaluated nor saved (the studies' rule, studies/verdict.py); 0 = off
    explode_factor: float = 2.0

    def __post_init__(self) -> None:
        _check(self.explode_factor == 0 or self.explode_factor > 1, "train.explode_factor", self.explode_factor,
               "must be > 1, or 0 (off)")
        for name in ("steps", "batch_size", "grad_accum", "max_nonfinite"):
            _check(getattr(self, name) >= 1, f"train.{name}", getattr(self, name), "must be >= 1")
        _check(self.mix in MIXES, "train.mix", self.mix, f"must be one of {', '.join(MIXES)}")
        _check(self.precision in PRECISIONS, "train.precision", self.precision, f"must be one of {', '.join(PRECISIONS)}")
        _check(self.strategy in STRATEGIES, "train.strategy", self.strategy, f"must be one of {', '.join(STRATEGIES)}")
        _check(self.ema is None or 0 < self.ema < 1, "train.ema", self.ema, "must be in (0, 1) or null")
        _check(self.num_workers >= 0, "train.num_workers", self.num_workers, "must be >= 0")
        _check(self.stop_at is None or self.stop_at >= 1, "train.stop_at", self.stop_at, "must be >= 1 or null")


@dataclass
class EvalConfig:
    every: int = 0  # steps between evaluations; 0 = only at the end
    batch_size: Optional[int] = None  # default: train.batch_size
    max_batches: Optional[int] = None  # per task and process; null = the whole eval set
    best: Optional[str] = None  # "task_id/metric" that picks best/; default: first task's primary
    best_mode: str = "auto"  # max | min | auto (the task's direction for its primary metric, else max)
    ema: bool = True  # evaluate the EMA weights when train.ema is set

    def __post_init__(self) -> None:
        _check(self.every >= 0, "eval.every", self.every, "must be >= 0")
        _check(self.best_mode in ("auto", "max", "min"), "eval.best_mode", self.best_mode, "must be auto, max or min")
        _check(self.batch_size is None or self.batch_size >= 1, "eval.batch_size", self.batch_size, "must be >= 1")
        _check(self.max_batches is None or self.max_batches >= 1, "eval.max_batches", self.max_batches, "must be >= 1")


@dataclass
class SaveConfig:
    every: int = 0  # steps between checkpoints; 0 = only at the end
    keep: int = 3  # the last K checkpoints are kept (best/ separately)

    def __post_init__(self) -> None:
        _check(self.every >= 0, "save.every", self.every, "must be >= 0")
        _check(self.keep >= 1, "save.keep", self.keep, "must be >= 1")


@dataclass
class LogConfig:
    every: int = 1  # steps between metric records
    progress: bool = True  # tqdm progress bar on rank 0
    # where the records go (engine/metrics_log.py): jsonl (always: resume and the studies read
    # it), tensorboard, csv, or module:Class of your own
    writers: List[str] = field(default_factory=lambda: ["jsonl", "tensorboard"])

    def __post_init__(self) -> None:
        _check(self.every >= 1, "log.every", self.every, "must be >= 1")
        _check("jsonl" in self.writers, "log.writers", self.writers,
               "must include jsonl (metrics.jsonl is the record that resume, compare and plot read)")
        _check(len(set(self.writers)) == len(self.writers), "log.writers", self.writers, "names a writer twice")


GUARD_MODES = ("off", "warn", "recover")


@dataclass
class GuardConfig:
    """The stability guard (engine/guard.py): the model update measured every ``every`` steps on
    a fixed probe batch; ``warn`` / ``recover`` when it jumps above ``factor`` x its recent median,
    or the training loss above ``loss_factor`` x its own."""

    mode: str = "off"  # off (nothing measured) | warn | recover
    every: int = 10  # steps between measurements (a probe forward each: ~2 % of a tiny recipe's step at 10)
    probe_items: int = 8  # items of the first training batch kept as the probe batch
    window: int = 20  # the recent measurements the level is the median of
    warmup: int = 5  # measurements before the guard may fire
    factor: float = 4.0  # fires above this x the level (update per unit of learning rate)
    loss_factor: float = 3.0  # also fires when the loss (median of 3 steps) tops this x its recent median (0: off)
    giveback: float = 0.5  # ... or when the loss (median of 30 steps) has lost this share of its progress (0: off)
    # ... or when the largest attention logit grows faster than this a step, ln, over 4 steps (0: off; 0.2
    # warns ~30 steps ahead of mid-warm-up blow-ups; the guard then costs 2.4-4.6 % of a tiny recipe's
    # step, not 0.7-2.6 %: docs/training.md)
    attention: float = 0.0
    lr_backoff: float = 0.5  # recover: the learning rate is multiplied by this, for the rest of the run
    snapshot_every: int = 10  # recover: healthy steps between in-memory snapshots to roll back to
    max_recoveries: int = 3  # recover: then the run goes on without rolling back (and may diverge)

    def __post_init__(self) -> None:
        if self.mode is False:  # YAML 1.1 reads a bare `off` as false
            self.mode = "off"
        _check(self.mode in GUARD_MODES, "guard.mode", self.mode, f"must be one of {', '.join(GUARD_MODES)}")
        for name in ("every", "probe_items", "window", "snapshot_every"):
            _check(getattr(self, name) >= 1, f"guard.{name}", getattr(self, name), "must be >= 1")
        _check(0 <= self.warmup, "guard.warmup", self.warmup, "must be >= 0")
        _check(self.max_recoveries >= 0, "guard.max_recoveries", self.max_recoveries, "must be >= 0")
        _check(self.factor > 1, "guard.factor", self.factor, "must be > 1")
        _check(self.loss_factor == 0 or self.loss_factor > 1, "guard.loss_factor", self.loss_factor,
               "must be 0 (off) or > 1")
        _check(0 < self.lr_backoff < 1, "guard.lr_backoff", self.lr_backoff, "must be in (0, 1)")
        _check(0 <= self.giveback < 1, "guard.giveback", self.giveback, "must be 0 (off) or in (0, 1)")
        _check(self.attention >= 0, "guard.attention", self.attention, "must be 0 (off) or > 0")


@dataclass
class TrainConfig:
    run_name: Optional[str] = None  # default: the config file's name
    output_dir: str = "checkpoints"
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    # safetensors to start from: the backbone and every head tensor whose name matches (engine/init.py)
    init_from: Optional[str] = None
    # the expert of a multiway init_from that a plain backbone takes (default: the tasks' modality)
    init_expert: Optional[str] = None
    tasks: List[Dict[str, Any]] = field(default_factory=list)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: LoopConfig = field(default_factory=LoopConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    save: SaveConfig = field(default_factory=SaveConfig)
    log: LogConfig = field(default_factory=LogConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    resume: bool = False  # continue the run in <output_dir>/<run_name> from its last checkpoint
    overwrite: bool = False  # replace an existing run directory instead of refusing
    # fields a resume may change (--allow-change optim.lr), e.g. ["optim.lr", "train.steps"]; any
    # other difference from the run's config.yaml is refused
    allow_change: List[str] = field(default_factory=list)
    checkpoint: Optional[str] = None  # `foundation eval`: a run dir, checkpoint dir or .safetensors

    def __post_init__(self) -> None:
        _check(self.device in DEVICES, "device", self.device, f"must be one of {', '.join(DEVICES)}")
        _check(not (self.resume and self.overwrite), "overwrite", self.overwrite, "cannot be combined with resume=true")

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / (self.run_name or "run")


@dataclass
class TaskEntry:
    """The keys of a ``tasks:`` item that belong to the engine; the rest are the task's."""

    name: str
    id: Optional[str] = None  # tells two entries of one task apart (default: name)
    weight: float = 1.0
    batch_size: Optional[int] = None  # default: train.batch_size


ENTRY_KEYS = tuple(TaskEntry.__dataclass_fields__)


@dataclass
class TaskSpec:
    """A validated ``tasks:`` item."""

    id: str
    name: str
    weight: float
    batch_size: Optional[int]
    cls: type
    config: Any  # an instance of cls.Config

    def task(self, backbone: BackboneConfig) -> Task:
        return self.cls(self.config, backbone)

    def entry(self, engine_keys: bool = True) -> dict:
        out = {"name": self.name, "id": self.id}
        if engine_keys:
            out.update(weight=self.weight, batch_size=self.batch_size)
        return {**out, **to_dict(self.config)}


def task_specs(entries: Sequence[Mapping[str, Any]], where: str = "config") -> list[TaskSpec]:
    if not entries:
        raise ConfigError(f"{where}: field 'tasks': list at least one task (known tasks: {', '.join(known_tasks())})")
    specs: list[TaskSpec] = []
    for i, item in enumerate(entries):
        here = f"{where}: tasks[{i}]"
        if not isinstance(item, Mapping) or "name" not in item:
            raise ConfigError(f"{here}: each task needs a 'name' (known tasks: {', '.join(known_tasks())})")
        engine = build(TaskEntry, {k: v for k, v in item.items() if k in ENTRY_KEYS}, where=here)
        try:
            cls = get_task(engine.name)
        except ConfigError as e:
            raise ConfigError(f"{here}: field 'name': {e}") from None
        fields = {k: v for k, v in item.items() if k not in ENTRY_KEYS}
        config = build(cls.Config, fields, where=f"{here} ({engine.name})")
        spec = TaskSpec(engine.id or engine.name, engine.name, engine.weight, engine.batch_size, cls, config)
        try:
            _check(math.isfinite(engine.weight) and engine.weight > 0, "weight", engine.weight,
                   "must be a finite number > 0")
            _check(engine.batch_size is None or engine.batch_size >= 1, "batch_size", engine.batch_size, "must be >= 1")
            _check(spec.id.isidentifier(), "id", spec.id, "must be a name (letters, digits, _)")
            _check(spec.id not in [s.id for s in specs], "id", spec.id, "two tasks have this id; give one another")
        except ConfigError as e:
            raise ConfigError(f"{here}: {e}") from None
        specs.append(spec)
    return specs


def best_metric(cfg: TrainConfig, specs: Sequence[TaskSpec]) -> tuple[str, bool]:
    """The metric that picks ``best/`` (``task_id/metric``) and whether higher is better: the
    one rule the loop and the studies share. ``eval.best_mode: auto`` takes the task's own
    direction for its primary metric and "higher" for any other metric."""
    key = cfg.eval.best or f"{specs[0].id}/{specs[0].cls.primary(specs[0].config)[0]}"
    tid, _, metric = key.partition("/")
    spec = next(s for s in specs if s.id == tid)
    if cfg.eval.best_mode != "auto":
        return key, cfg.eval.best_mode == "max"
    own, higher = spec.cls.primary(spec.config)
    return key, higher if metric == own else True


def shipped_configs_dir() -> Path | None:
    """The configs/ folder shipped with the package (package ``foundation_configs``, mapped
    onto configs/ in pyproject), else the one beside the sources (a clone on PYTHONPATH)."""
    import importlib.util

    spec = importlib.util.find_spec("foundation_configs")  # a data-only (namespace) package
    if spec is not None and spec.submodule_search_locations:
        root = Path(list(spec.submodule_search_locations)[0])
    else:
        root = Path(__file__).resolve().parents[2] / "configs"
    return root if root.is_dir() else None


def find_config(path: str | Path) -> Path:
    """A config file by path (relative to the current directory), else a shipped config by
    name: ``vision/tiny_finetune``, with or without ``.yaml`` and ``configs/``, so
    the README's ``configs/...`` paths work from any directory."""
    path = Path(path)
    if path.is_file():
        return path
    shipped = shipped_configs_dir()
    name = Path(*path.parts[1:]) if path.parts[:1] == ("configs",) else path
    if shipped is not None and not path.is_absolute() and name.name:
        for candidate in (name, name.with_name(name.name + ".yaml")):
            if (shipped / candidate).is_file():
                return shipped / candidate
    where = f" (nor a shipped config under {shipped}: e.g. vision/tiny_finetune)" if shipped else ""
    raise ConfigError(f"config file not found: {path}{where}")


def load_config(path: str | Path, overrides: Sequence[str] = (), *, check_data: bool = True) -> tuple[TrainConfig, list[TaskSpec]]:
    """Read, override and validate a training config: types, values, tasks, paths.

    Returns the config (its ``tasks`` normalised to full entries, as saved in the run
    directory) and the task specs. Everything that can be checked without training is.
    ``path`` is a file, or the name of a shipped config (see ``find_config``).
    """
    path = find_config(path)
    raw = read_yaml(path, overrides)
    return resolve(raw, where=str(path), default_name=path.stem, check_data=check_data)


def resolve(raw: Any, *, where: str = "config", default_name: str = "run", check_data: bool = True) -> tuple[TrainConfig, list[TaskSpec]]:
    """Validate a config tree (dict / OmegaConf / TrainConfig) into (TrainConfig, specs)."""
    if isinstance(raw, TrainConfig):
        raw = to_dict(raw)
    if isinstance(raw, (Mapping, DictConfig)):
        backbone = raw.get("backbone")
        if backbone is not None:  # first alone, so that its semantic errors name the section
            backbone = build(BackboneConfig, backbone, where=f"{where}: backbone")
    else:
        backbone = None
    cfg = build(TrainConfig, raw, where=where)
    if backbone is not None:
        # from the user's fields alone: merged over the default section, derived fields
        # (ffn_dim = 4 * dim) would keep the defaults' values (3072 for any dim)
        cfg.backbone = backbone
    cfg.run_name = cfg.run_name or default_name
    specs = task_specs(cfg.tasks, where)
    cfg.tasks = [s.entry() for s in specs]
    for name in ("init_from", "checkpoint"):
        value = getattr(cfg, name)
        if value is not None and not Path(value).exists():
            raise ConfigError(f"{where}: field {name!r}: not found: {value}")
    if cfg.eval.best is not None:
        task_id, _, metric = cfg.eval.best.partition("/")
        if task_id not in [s.id for s in specs] or not metric:
            raise ConfigError(f"{where}: field 'eval.best': must be 'task_id/metric' with task_id one of "
                              f"{', '.join(s.id for s in specs)} (got {cfg.eval.best!r})")
    if check_data:
        for i, spec in enumerate(specs):
            try:
                spec.task(cfg.backbone).check()
            except ConfigError as e:
                raise ConfigError(f"{where}: tasks[{i}] ({spec.name}): {e}") from None
    return cfg, specs
