"""The trained model: one shared ``Backbone`` and one head per task.

It is a registered checkpoint kind, so ``foundation.checkpoint.load(path)`` rebuilds it
from a run's ``model.safetensors`` alone (the task packages must be importable).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List

from torch import nn

from foundation import checkpoint
from foundation.config import BackboneConfig, build
from foundation.engine.config import task_specs
from foundation.engine.task import SharedModules, Task
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
        task_specs(cfg.tasks, where)  # validates every task entry
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
        self.config = config
        self.backbone = Backbone(config.backbone)
        specs = task_specs(config.tasks, "model config")
        self.tasks: dict[str, Task] = {s.id: s.task(config.backbone) for s in specs}
        shared = SharedModules()  # this model's modules used by several heads (the VL embedding)
        self.heads = nn.ModuleDict({tid: task.build_head(shared) for tid, task in self.tasks.items()})

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


checkpoint.register_model_kind("MultiTaskModel", MultiTaskModel, ModelConfig, ModelConfig.from_dict)
