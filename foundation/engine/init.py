"""``init_from``: the one way to start a model from a file.

``load_init_from(model, path)`` loads into a ``MultiTaskModel``

* the backbone: ``backbone.*`` of a run's or a converted file (or a ``Backbone`` file's
  own keys), across multiway layouts (``foundation.multiway.adapt_state``: a plain
  backbone takes one expert of a multiway file, ``init_expert``, by default the tasks'
  modality; the experts of a multiway backbone all start from a shared module);
* every head tensor whose name matches: our ``heads.<id>.<rest>`` takes the file's
  ``heads.<id>.<rest>`` (the same id first, else any head holding ``<rest>``; heads that
  share a module, such as the VL embedding, hold equal copies; heads of a multi-task run
  that hold different values are skipped, saying so), or a top-level ``<rest>``
  (a ``VisionTransformer`` file's ``patch_embed`` / ``pos_embed``, a converted BEiT-3's
  ``embed.*``). So a MIM run's front end goes into classification or segmentation, a
  BEST-RQ run's VGG front end into ASR, a VL pretraining run's embedding into VQA / NLVR2.

Every candidate goes through ``Task.adapt_init(name, tensor, target)``: it returns the
tensor (resized: position embeddings, relative-position tables) or None / a reason to
skip it (a classifier with other classes, data statistics a task keeps its own). A
backbone tensor of another shape is offered to the tasks' hooks too, and is an error when
none fits it. One summary line says what was loaded, resized and skipped, and why.

``check_init_from`` refuses a file whose backbone means something else (width, depth,
norm rule ...) before any work; ``train`` calls it. It lives here, not in the config
module, so that ``engine.config`` does not import the model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from foundation import checkpoint
from foundation.config import BackboneConfig, ConfigError
from foundation.engine.model import MultiTaskModel
from foundation.multiway import adapt_state, state_experts

# what must agree for pretrained weights to mean the same thing here (keys and shapes cannot
# tell a 4-head from a 2-head attention, nor Pre-LN from Post-LN weights)
_SAME_MEANING = ("dim", "depth", "ffn_dim", "heads", "norm", "arch", "activation", "residual_scale")


def _saved_backbone(path: str | Path) -> BackboneConfig | None:
    """The backbone config stored in a checkpoint of ours (a run's model, a Backbone, a
    BEiT3 ...), or None for a file without one (converted weights)."""
    try:
        _, cfg = checkpoint.read_config(path)
    except (checkpoint.CheckpointError, ConfigError, ImportError):
        return None
    return cfg if isinstance(cfg, BackboneConfig) else getattr(cfg, "backbone", None)


def check_init_from(ours: BackboneConfig, path: str | Path) -> None:
    """ConfigError, naming the overrides that fix it, when the backbone stored in ``path``
    differs from ``ours`` in what its weights mean (width, depth, heads, the rule, ...);
    nothing for a file without a stored config. A file that is not whole safetensors
    (truncated, another format) is refused too."""
    if not Path(path).exists():
        raise ConfigError(f"field 'init_from': not found: {path}")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            f.keys()
    except (SafetensorError, OSError) as e:
        raise ConfigError(f"field 'init_from': {path} is not a readable safetensors file ({e}); "
                          "truncated, or another format") from None
    saved = _saved_backbone(path)
    if saved is None:
        return
    diff = [f for f in _SAME_MEANING if getattr(saved, f) != getattr(ours, f)]
    if diff:
        raise ConfigError(
            f"field 'init_from': {path} holds a backbone with "
            + ", ".join(f"{f}={getattr(saved, f)!r}" for f in diff) + " where this config has "
            + ", ".join(f"{f}={getattr(ours, f)!r}" for f in diff) + "; to fine-tune from it add "
            + " ".join(f"backbone.{f}={getattr(saved, f)}" for f in diff) + " to the command line")


def split_state(state: Mapping[str, torch.Tensor]) -> tuple[dict, dict[str, dict], dict]:
    """(backbone tensors, {head id: its tensors}, top-level tensors) of a file, prefixes
    removed. A file without ``backbone.*`` keys is a ``Backbone``'s own (no heads)."""
    if not any(k.startswith("backbone.") for k in state):
        return dict(state), {}, {}
    heads = sorted({k.split(".", 2)[1] for k in state if k.startswith("heads.") and k.count(".") >= 2})
    top = {k: v for k, v in state.items() if not k.startswith(("backbone.", "heads."))}
    return (checkpoint.sub_state(state, "backbone."), {h: checkpoint.sub_state(state, f"heads.{h}.") for h in heads},
            top)


@dataclass
class InitReport:
    """What ``load_init_from`` did, by model tensor name (``backbone.*``, ``heads.<id>.*``)."""

    path: str
    loaded: list[str] = field(default_factory=list)
    resized: dict[str, str] = field(default_factory=dict)  # name -> "old shape -> new shape"
    skipped: dict[str, str] = field(default_factory=dict)  # name -> reason
    missing: list[str] = field(default_factory=list)  # backbone tensors the file lacks
    unexpected: list[str] = field(default_factory=list)  # backbone tensors of the file not used
    kept: list[str] = field(default_factory=list)  # head tensors the file lacks (keep their start)
    unused: list[str] = field(default_factory=list)  # file's head / top-level tensors no head took
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        def some(items, n=10):
            items = list(items)
            return ": " + ", ".join(items[:n]) + (f", ... (+{len(items) - n})" if len(items) > n else "") if items else ""

        heads = [k for k in self.loaded if k.startswith("heads.")]
        return (f"init_from {self.path}: loaded {len(self.loaded)} tensors ({len(self.loaded) - len(heads)} backbone"
                f"{' - ' + '; '.join(self.notes) if self.notes else ''}; {len(heads)} head{some(heads, 8)}); "
                f"resized {len(self.resized)}{some(f'{k} {v}' for k, v in self.resized.items())}; "
                f"skipped {len(self.skipped)}{some(f'{k} ({v})' for k, v in self.skipped.items())}; "
                f"missing {len(self.missing)}{some(self.missing)}; unexpected {len(self.unexpected)}"
                f"{some(self.unexpected)}; head tensors kept their initialisation {len(self.kept)}; "
                f"not used from the file's heads {len(self.unused)}{some(self.unused, 8)}")


def _shape(t: torch.Tensor) -> str:
    return "x".join(map(str, t.shape)) or "scalar"


def _adapt(adapt: Callable, name: str, value: torch.Tensor, target: torch.Tensor, report: InitReport,
           full: str) -> torch.Tensor | None:
    """``adapt(name, value, target)`` recorded in ``report``; the fitted tensor or None."""
    out = adapt(name, value, target)
    if out is None or isinstance(out, str):
        report.skipped[full] = out or (f"{_shape(value)} here, {_shape(target)} in the model"
                                       if value.shape != target.shape else "the task keeps its own")
        return None
    if out.shape != target.shape:
        raise ConfigError(f"field 'init_from': {full}: the task made {_shape(out)} of it where the model has "
                          f"{_shape(target)}")
    if out is not value:
        report.resized[full] = f"{_shape(value)} -> {_shape(out)}"
    return out.to(target.dtype)


def _head_source(rest: str, tid: str, heads: dict[str, dict], top: dict) -> tuple[str, torch.Tensor | str] | None:
    """(file key, tensor) for our ``heads.<tid>.<rest>``: the same head id first, else the
    one value the file's heads hold under ``rest``, else a top-level ``rest``. Heads that
    hold different values (two tasks of a multi-task run): (their names, why it is skipped)."""
    if rest in heads.get(tid, {}):
        return f"heads.{tid}.{rest}", heads[tid][rest]
    found = [(h, heads[h][rest]) for h in sorted(heads) if rest in heads[h]]
    if found:
        first = found[0][1]
        if any(v.shape != first.shape or not torch.equal(v, first) for _, v in found[1:]):
            return (", ".join(f"heads.{h}.{rest}" for h, _ in found),
                    f"heads {', '.join(h for h, _ in found)} of the file hold different values")
        return f"heads.{found[0][0]}.{rest}", first
    if rest in top:
        return rest, top[rest]
    return None


def load_init_from(model: MultiTaskModel, path: str | Path, expert: str | None = None, log=print) -> InitReport:
    """Load ``path`` into ``model`` (see the module docstring); logs and returns the report.
    ``expert``: the config's ``init_expert``."""
    check_init_from(model.backbone.config, path)
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise ConfigError(f"field 'init_from': {path} is not a readable safetensors file ({e})") from None
    backbone_state, heads, top = split_state(state)
    report = InitReport(str(path))
    fitted: dict[str, torch.Tensor] = {}

    # the backbone
    ours = model.backbone.config
    own = model.backbone.state_dict()
    source_experts = state_experts(backbone_state)
    if expert is None:
        modalities = sorted({t.modality for t in model.tasks.values() if t.modality})
        expert = modalities[0] if len(modalities) == 1 else None
    adapted = adapt_state(backbone_state, own, ours.experts, expert)
    if adapted.needs_expert:  # plain layers here, experts in the checkpoint
        if expert is None:
            raise ConfigError(f"field 'init_expert': {path} is multiway (experts {', '.join(source_experts)}) where "
                              "this backbone is not, and the tasks do not name one modality: set init_expert to one "
                              f"of {', '.join(source_experts)}")
        if expert not in source_experts:
            raise ConfigError(f"field 'init_expert': {expert!r} is not an expert of {path} "
                              f"(it has {', '.join(source_experts)})")
        report.notes.append(f"the {expert!r} expert into the plain layers")
    if adapted.copied_shared:
        report.notes.append(f"every expert ({', '.join(ours.experts)}) from the shared layers")
    misfits = []
    for k, v in adapted.state.items():
        name = f"backbone.{k}"
        if v.shape != own[k].shape:  # e.g. a relative-position table of another patch grid: the tasks resize it
            for task in model.tasks.values():
                out = task.adapt_init(name, v, own[k])
                if isinstance(out, torch.Tensor) and out.shape == own[k].shape:
                    report.resized[name] = f"{_shape(v)} -> {_shape(out)}"
                    v = out.to(own[k].dtype)
                    break
            else:
                misfits.append(name)
                continue
        fitted[name] = v
    if misfits:
        raise ConfigError(f"field 'init_from': {path}: shapes differ from the configured backbone for "
                          f"{', '.join(misfits[:10])}")
    report.missing = [k for k in own if k not in adapted.state]
    report.unexpected = sorted(set(backbone_state) - adapted.used)

    # the heads
    used = set()
    for tid, head in model.heads.items():
        task = model.tasks[tid]
        for rest, target in head.state_dict().items():
            full = f"heads.{tid}.{rest}"
            src = _head_source(rest, tid, heads, top)
            if src is None:
                report.kept.append(full)
                continue
            used.update(src[0].split(", "))
            if isinstance(src[1], str):  # which one this head should start from is not clear
                report.skipped[full] = src[1]
                continue
            value = _adapt(task.adapt_init, rest, src[1], target, report, full)
            if value is not None:
                fitted[full] = value
    file_heads = [f"heads.{h}.{k}" for h, part in heads.items() for k in part] + list(top)
    report.unused = [k for k in file_heads if k not in used]

    nonfinite = [k for k, v in fitted.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if nonfinite:  # they would turn every weight non-finite at the first step
        raise ConfigError(f"field 'init_from': {path}: {len(nonfinite)} tensor(s) hold NaN or inf "
                          f"({', '.join(nonfinite[:5])}); these weights cannot be trained from")
    if not fitted:  # a run would silently start from scratch: an unrelated file, or one renamed by hand
        names = ", ".join(list(state)[:3]) + (", ..." if len(state) > 3 else "")
        raise ConfigError(f"field 'init_from': {path}: none of its {len(state)} tensors ({names}) is a tensor of "
                          "this model (backbone.* / heads.<task>.*); expected a run's model.safetensors")
    result = model.load_state_dict(fitted, strict=False)
    assert not result.unexpected_keys, result.unexpected_keys
    report.loaded = list(fitted)
    log(report.summary())
    return report
