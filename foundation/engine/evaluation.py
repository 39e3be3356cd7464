"""Evaluation and batch loading, shared by the training loop and ``foundation eval``: every
task's metric exact over its whole eval set and all ranks, under the run's autocast; a batch
that fails to load is a ``DataError`` naming the task (the readers' messages name the file)."""
from __future__ import annotations

import contextlib
from typing import Any

import torch

from foundation.config import ConfigError
from foundation.engine import distributed
from foundation.engine.config import TaskSpec, TrainConfig
from foundation.engine.data import eval_batches, to_device
from foundation.engine.distributed import Env
from foundation.engine.failure import DataError, one_line
from foundation.engine.model import MultiTaskModel


def autocast(cfg: TrainConfig, device: torch.device):
    precision = cfg.train.precision
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError("field 'train.precision': fp16 needs CUDA; use bf16 or fp32 on CPU")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


@torch.no_grad()
def evaluate(model: MultiTaskModel, specs: list[TaskSpec], cfg: TrainConfig, env: Env,
             datasets: dict[str, Any] | None = None) -> dict[str, float]:
    """{"task_id/metric": value} for every task, exact over the whole eval set and all ranks.
    ``datasets`` caches the eval sets between calls."""
    datasets = {} if datasets is None else datasets
    was_training = model.training
    model.eval()
    out: dict[str, float] = {}
    batch_size = cfg.eval.batch_size or cfg.train.batch_size
    try:
        with distributed.unsharded(model):
            for spec in specs:
                task, head = model.tasks[spec.id], model.heads[spec.id]
                if spec.id not in datasets:
                    datasets[spec.id] = task.eval_dataset()
                dataset = datasets[spec.id]
                if len(dataset) < env.world:
                    raise ConfigError(f"task {spec.id!r}: the eval set has {len(dataset)} samples, fewer than {env.world} processes")
                totals: dict[str, torch.Tensor] = {}
                batches = eval_batches(dataset, task.collate, spec.batch_size or batch_size, env.rank, env.world,
                                       cfg.eval.max_batches)
                for batch in loading(batches, spec.id, "eval"):
                    with autocast(cfg, env.device):
                        sums = task.eval_step(head, model.backbone, to_device(batch, env.device))
                    for k, v in sums.items():
                        v = torch.as_tensor(v, device=env.device).detach().double()
                        totals[k] = totals[k] + v if k in totals else v
                for k in sorted(totals):
                    distributed.all_reduce(totals[k])
                for k, v in task.metrics(totals).items():
                    out[f"{spec.id}/{k}"] = float(v)
    finally:
        model.train(was_training)
    return out


def next_batch(it, task_id: str, split: str) -> Any:
    """``next(it)``, with an error raised while loading the batch (a bad file) as a
    ``DataError`` naming the task: the readers' own messages name the file."""
    try:
        return next(it)
    except (StopIteration, KeyboardInterrupt, DataError):
        raise
    except Exception as e:  # noqa: BLE001 - whatever the reader raised, said in one line
        raise DataError(f"task {task_id!r} ({split} data): {one_line(e)}") from e


def loading(batches, task_id: str, split: str):
    """``batches`` through ``next_batch``."""
    it = iter(batches)
    while True:
        try:
            batch = next_batch(it, task_id, split)
        except StopIteration:
            return
        yield batch
