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
from foundation.engine.task import Task
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


checkpoint.register_model_kind("MultiTaskModel", MultiTaskModel, ModelConfig, ModelConfig.from_dict)
