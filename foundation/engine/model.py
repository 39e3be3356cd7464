"""The trained model: one shared ``Backbone`` and one head per task.

It is a registered checkpoint kind, so ``foundation.checkpoint.load(path)`` rebuilds it
from a run's ``model.safetensors`` alone (the task packages must be importable).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List

import torch
from torch import nn

from foundation import checkpoint
from foundation.config import BackboneConfig, ConfigError, build
from foundation.engine.task import Task
from foundation.multiway import adapt_state, state_experts
from foundation.transformer import Backbone


@dataclass
class ModelConfig:
    """What builds the model: the backbone and the tasks' own fields (no data order,
    weights or batch sizes; those are training settings)."""

    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    tasks: List[Dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict, where: str = "model config") -> "ModelConfig":
        cfg = build(cls, data, where=where)
        from foundation.engine.config import task_specs  # validates every task entry

        task_specs(cfg.tasks, where)
        return cfg

    @classmethod
    def from_specs(cls, backbone: BackboneConfig, specs) -> "ModelConfig":
        return cls(backbone=backbone, tasks=[s.entry(engine_keys=False) for s in specs])


class MultiTaskModel(nn.Module):
    """``model(task_id, batch) -> (loss, logs)``: the task's head around the shared backbone.

    ``model.tasks`` holds the ``Task`` objects (data, metrics) by id; ``model.heads`` their
    modules. Forward goes through this module so that DDP / FSDP wrap one module."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        from foundation.engine.config import task_specs

        self.config = config
        self.backbone = Backbone(config.backbone)
        specs = task_specs(config.tasks, "model config")
        self.tasks: dict[str, Task] = {s.id: s.task(config.backbone) for s in specs}
        self.heads = nn.ModuleDict({tid: task.build_head() for tid, task in self.tasks.items()})

    def forward(self, task_id: str, batch: Any):
        return self.heads[task_id](self.backbone, batch)

    def export_meta(self) -> dict[str, dict]:
        """``{task id: task.export_meta()}``, written by ``checkpoint.save`` into every model
        file. A model rebuilt from a file keeps that file's (``saved_meta``): its training
        data may be gone, and the saved values are the ones its weights were trained with."""
        saved = getattr(self, "saved_meta", None) or {}
        out = {}
        for tid, task in self.tasks.items():
            meta = saved.get(tid) or task.export_meta()
            if meta:
                out[tid] = meta
        return out


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
    nothing for a file without a stored config. Runs when the config is resolved; a file
    that is not whole safetensors (truncated, another format) is refused here too."""
    from safetensors import SafetensorError, safe_open

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


def load_backbone(model: MultiTaskModel, path: str | Path, expert: str | None = None, log=print) -> None:
    """Pretrained backbone weights (``init_from``) from a safetensors file: a Backbone's own,
    or any file whose backbone keys carry a ``backbone.`` prefix, such as our runs' checkpoints.

    The multiway layouts may differ (``foundation.multiway.adapt_state``): a plain backbone
    takes the weights of one expert of a multiway checkpoint - ``expert`` (the config's
    ``init_expert``), by default the modality of the model's tasks (``Task.modality``) -
    and the experts of a multiway backbone all start from a shared checkpoint module.
    What was loaded, missing and left unused is logged."""
    from safetensors.torch import load_file

    from safetensors import SafetensorError

    try:
        state = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise ConfigError(f"field 'init_from': {path} is not a readable safetensors file ({e})") from None
    if any(k.startswith("backbone.") for k in state):
        state = {k[len("backbone."):]: v for k, v in state.items() if k.startswith("backbone.")}
    ours = model.backbone.config
    check_init_from(ours, path)
    own = model.backbone.state_dict()
    source_experts = state_experts(state)
    where = f"init_from {path}"
    if expert is None:
        modalities = sorted({t.modality for t in model.tasks.values() if t.modality})
        expert = modalities[0] if len(modalities) == 1 else None
    adapted = adapt_state(state, own, ours.experts, expert)
    notes = []
    if adapted.needs_expert:  # plain layers here, experts in the checkpoint
        if expert is None:
            raise ConfigError(f"field 'init_expert': {path} is multiway (experts {', '.join(source_experts)}) where "
                              "this backbone is not, and the tasks do not name one modality: set init_expert to one "
                              f"of {', '.join(source_experts)}")
        if expert not in source_experts:
            raise ConfigError(f"field 'init_expert': {expert!r} is not an expert of {path} "
                              f"(it has {', '.join(source_experts)})")
        notes.append(f"the {expert!r} expert into the plain layers")
    if adapted.copied_shared:
        notes.append(f"every expert ({', '.join(ours.experts)}) from the shared layers")
    nonfinite = [k for k, v in adapted.state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if nonfinite:  # they would turn every weight non-finite at the first step
        raise ConfigError(f"field 'init_from': {path}: {len(nonfinite)} tensor(s) hold NaN or inf "
                          f"({', '.join(nonfinite[:5])}); these weights cannot be trained from")
    shapes = [k for k, v in adapted.state.items() if v.shape != own[k].shape]
    if shapes:
        raise ConfigError(f"field 'init_from': {path}: shapes differ from the configured backbone for "
                          f"{', '.join(shapes[:10])}")
    result = model.backbone.load_state_dict(adapted.state, strict=False)
    missing = result.missing_keys
    unexpected = sorted(set(state) - adapted.used)
    log(f"{where}: loaded {len(adapted.state)} tensors{' (' + '; '.join(notes) + ')' if notes else ''}; "
        f"missing {len(missing)}{': ' + ', '.join(missing[:10]) if missing else ''}; "
        f"unexpected {len(unexpected)}{': ' + ', '.join(unexpected[:10]) if unexpected else ''}")


checkpoint.register_model_kind("MultiTaskModel", MultiTaskModel, ModelConfig, ModelConfig.from_dict)
