"""The task contract: what a folder in ``foundation_tasks/`` gives the engine, and how it is found.

A task is a class derived from ``Task``, registered with ``@register_task("name")`` in
the package ``foundation_tasks.<name>``. The engine never imports a task statically: the config
names it (``tasks: [{name: seq2seq, ...}]``) and ``get_task`` imports ``foundation_tasks.<name>``,
whose import runs the decorator. A new task is a new folder plus a config.

What a task provides::

    @register_task("seq2seq")
    class Seq2Seq(Task):
        Config = Seq2SeqConfig          # dataclass of the task's own config fields
        primary_metric = "exact_match"  # the metric that picks the best checkpoint
        higher_is_better = True         # its direction
        embedding_params = ("embed",)   # head parameters below the backbone (layer 0)
        modality = "text"               # its tokens' expert in a multiway backbone (optional)

        def check(self): ...            # paths exist? raise ConfigError naming the field
        def build_head(self, shared=None): ...  # nn.Module: forward(backbone, batch) -> (loss, logs)
        def train_dataset(self): ...    # map-style Dataset (the engine samples and shards it)
        def eval_dataset(self): ...
        def collate(self, samples): ... # list of dataset items -> batch (tensors in dicts)
        def eval_step(self, head, backbone, batch): ...  # -> {name: summed tensor}
        def metrics(self, totals): ...  # summed tensors (all batches, all ranks) -> {name: float}

The pieces and why they are shaped so:

* ``build_head(shared)`` builds everything the task adds around the shared ``Backbone``
  (front end / embeddings, head, loss). The head does not hold the backbone: the engine
  keeps one backbone in a ``MultiTaskModel`` and calls ``head(backbone, batch)``, so
  several tasks share it and DDP / FSDP see one module. The head returns the scalar
  training loss and a dict of floats or 0-d tensors to log (``logs``). A head may list
  parameters exempt from weight decay in ``no_weight_decay()`` (timm's convention);
  1-d parameters (biases, norms) never decay. ``shared`` (a ``SharedModules``, one per
  model) holds modules several tasks' heads use together (the VL tasks' one BEiT-3
  embedding): ``shared.get_or_create(name, settings, factory)``. Tasks that share nothing
  ignore it; a head built alone (``shared=None``) uses a registry of its own.
* ``adapt_init(name, tensor, target)``: the model starts from ``init_from``
  (``foundation.engine.init``), which offers each task every tensor of the file whose
  name matches one of its head's (and backbone tensors of another shape); the task
  returns it (resized where it can: position embeddings of another patch grid), or None
  or a reason to skip it (another number of classes; statistics of its own data).
* Data is a map-style ``Dataset`` plus ``collate``; the engine owns the sampler, so that
  the data order is a function of (seed, epoch) only, each rank takes its shard of every
  global batch, and a run resumes at the exact sample. Per-sample randomness (augment-
  ation) must likewise come from a generator seeded by the item, not the global RNG.
* Evaluation is ``eval_step`` -> sums, then ``metrics(totals)``. The engine adds the sums
  over batches and over ranks before ``metrics`` turns them into numbers (accuracy =
  correct / total, WER = errors / words, mIoU from per-class intersections and unions),
  so every metric is exact under data parallelism.
* ``primary_metric`` / ``higher_is_better`` decide the best checkpoint.
* Using a trained model (``foundation predict``, ``foundation.load_predictor``): every model
  file holds ``export_meta()`` of each task (class names, image statistics, a tokenizer's
  bytes: JSON values or bytes), so that ``predictor(head, backbone, meta, device)`` can turn
  a user's files into records with no data folder (``foundation.engine.predict``). A task
  without a predictor leaves both out.
"""
from __future__ import annotations

import abc
import dataclasses
import importlib
import importlib.util
import pkgutil
from typing import Any, Callable, ClassVar, Mapping, Optional

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from foundation.config import BackboneConfig, ConfigError

TASKS: dict[str, type["Task"]] = {}
TASKS_PACKAGE = "foundation_tasks"


class Task(abc.ABC):
    """One training objective around the shared backbone (see the module docstring)."""

    name: ClassVar[str] = ""  # set by register_task
    Config: ClassVar[type]  # a dataclass; its fields are the task's section of the YAML
    primary_metric: ClassVar[str]
    higher_is_better: ClassVar[bool] = True

    @classmethod
    def primary(cls, config: Any) -> tuple[str, bool]:
        """The metric that picks the best checkpoint and whether higher is better, for this
        task's ``config``; a task whose metric depends on its config (MIM's target) overrides it."""
        return cls.primary_metric, cls.higher_is_better
    # name prefixes of head parameters that sit below the backbone (embeddings, front
    # ends); layer-wise lr decay puts them in layer 0 and the rest of the head on top
    embedding_params: ClassVar[tuple[str, ...]] = ("embed", "patch_embed", "pos_embed", "cls_token", "mask_token")
    # the modality of the tokens it gives the backbone (vision, text, speech): the expert they
    # take in a multiway backbone, and the expert a plain backbone is initialised from when
    # ``init_from`` is multiway (the config's ``init_expert`` overrides); None for tasks that
    # name their segments themselves (vision-language)
    modality: ClassVar[Optional[str]] = None

    def __init__(self, cfg: Any, backbone: BackboneConfig):
        self.cfg, self.backbone_cfg = cfg, backbone

    def check(self) -> None:
        """Check what the config points at (data paths, vocabularies) before any work;
        raise ``ConfigError`` naming the field. Runs for ``train`` and ``eval``, not when a
        checkpoint is merely loaded elsewhere."""

    @abc.abstractmethod
    def build_head(self, shared: Optional["SharedModules"] = None) -> nn.Module:
        """The task's modules; ``head(backbone, batch)`` returns ``(loss, logs)``. ``shared``:
        the model's registry of modules shared between tasks (see the module docstring)."""

    def adapt_init(self, name: str, tensor: torch.Tensor, target: torch.Tensor) -> torch.Tensor | str | None:
        """``tensor`` of the ``init_from`` file for this task's ``name`` (a name in its head,
        or ``backbone.*`` for a backbone tensor of another shape), fitted to ``target``'s shape;
        None or a reason (str) skips it. By default: equal shapes load, others are skipped."""
        return tensor if tensor.shape == target.shape else None

    @abc.abstractmethod
    def train_dataset(self) -> Dataset: ...

    @abc.abstractmethod
    def eval_dataset(self) -> Dataset: ...

    def collate(self, samples: list) -> Any:
        return default_collate(samples)

    @abc.abstractmethod
    def eval_step(self, head: nn.Module, backbone: nn.Module, batch: Any) -> Mapping[str, torch.Tensor]:
        """Sums over this batch (counts, errors, per-class tensors) for ``metrics``."""

    @abc.abstractmethod
    def metrics(self, totals: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """Metrics from sums over the whole evaluation set; must contain ``primary_metric``."""

    def export_meta(self) -> dict[str, Any]:
        """What this task's predictor needs beyond the weights and the config, from the
        training data (class names, a tokenizer's bytes ...): JSON values or ``bytes``.
        Written into every model file the run saves, so keep it cheap (cache it)."""
        return {}

    def predictor(self, head: nn.Module, backbone: nn.Module, meta: Mapping[str, Any], device: torch.device) -> Any:
        """A ``foundation.engine.predict.Predictor`` around the trained ``head`` and
        ``backbone``; ``meta`` is what ``export_meta`` saved."""
        raise NoPredictor(f"task {self.name!r} has no predictor: foundation predict serves tasks that map a "
                          "user's file to an answer (classification, segmentation, asr, vqa, nlvr2)")


class SharedModules:
    """Modules that the heads of one model share (``Task.build_head(shared)``): the first
    task that asks for ``name`` builds it, the others get the same object, and every task
    must ask with the same ``settings`` (a ``ConfigError`` names those that differ)."""

    def __init__(self) -> None:
        self._items: dict[str, tuple[Any, dict[str, Any], str]] = {}  # name -> (object, settings, first task)

    def get_or_create(self, name: str, settings: Mapping[str, Any], factory: Callable[[], Any],
                      owner: str = "") -> Any:
        if name not in self._items:
            self._items[name] = (factory(), dict(settings), owner)
        obj, theirs, first = self._items[name]
        if theirs != dict(settings):
            diff = [f"{k}: {settings.get(k)!r} here, {theirs.get(k)!r} in {first or 'another task'}"
                    for k in sorted(set(settings) | set(theirs)) if settings.get(k) != theirs.get(k)]
            raise ConfigError(f"the tasks of one model share the {name}, so these fields must agree: " + "; ".join(diff))
        return obj


class NoPredictor(ValueError):
    """A model (or one of its tasks) that ``foundation predict`` cannot run; the message says why."""


def register_task(name: str) -> Callable[[type[Task]], type[Task]]:
    def deco(cls: type[Task]) -> type[Task]:
        if not (isinstance(cls, type) and issubclass(cls, Task)):
            raise TypeError(f"@register_task({name!r}) must decorate a Task subclass")
        if not dataclasses.is_dataclass(getattr(cls, "Config", None)):
            raise TypeError(f"task {name!r}: {cls.__qualname__}.Config must be a dataclass")
        if not getattr(cls, "primary_metric", None):
            raise TypeError(f"task {name!r}: {cls.__qualname__}.primary_metric is not set")
        known = TASKS.get(name)
        if known is not None and known.__qualname__ != cls.__qualname__:
            raise ValueError(f"task {name!r} is already registered for {known.__qualname__}")
        cls.name = name
        TASKS[name] = cls
        return cls

    return deco


class MissingExtra(ConfigError):
    """A task's third-party packages are not installed; the message names the install extra."""


def require_extra(extra: str, *modules: str) -> None:
    """First line of a task package whose code needs an optional install extra: fail at
    start, with the pip command, instead of at the first batch that reaches a lazy import.
    ``find_spec`` only looks the modules up; nothing is imported."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingExtra(f"needs {', '.join(missing)} (the {extra!r} extra): "
                           f"pip install 'foundation-suite[{extra}]'")


def known_tasks() -> list[str]:
    """Registered tasks plus the folders of the ``foundation_tasks`` package (not imported)."""
    names = set(TASKS)
    try:
        pkg = importlib.import_module(TASKS_PACKAGE)
        # `*_common` packages hold what several tasks share; they are not tasks
        names.update(m.name for m in pkgutil.iter_modules(pkg.__path__) if m.ispkg and not m.name.endswith("_common"))
    except ImportError:
        pass
    return sorted(names)


def get_task(name: str) -> type[Task]:
    """The Task class called ``name``, importing ``foundation_tasks.<name>`` on first use."""
    if name not in TASKS:
        if not name.isidentifier():
            raise ConfigError(f"unknown task {name!r}; known tasks: {', '.join(known_tasks()) or 'none'}")
        module = f"{TASKS_PACKAGE}.{name}"
        try:
            importlib.import_module(module)
        except MissingExtra as e:
            raise MissingExtra(f"task {name!r} {e}") from None
        except ModuleNotFoundError as e:
            if e.name not in (TASKS_PACKAGE, module):
                raise  # the task exists but one of its own imports is missing: show that
            raise ConfigError(f"unknown task {name!r}; known tasks: {', '.join(known_tasks()) or 'none'}") from None
        if name not in TASKS:
            raise ConfigError(f"{module} was imported but registers no task {name!r} (@register_task({name!r}))")
    return TASKS[name]
