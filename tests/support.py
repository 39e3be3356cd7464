"""Plain helpers several test files import (``from support import ...``): pytest puts this
folder on ``sys.path`` because ``tests/conftest.py`` lives here outside a package."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import torch
from torch import nn


def perturb_layernorms(model: nn.Module, seed: int = 1, tokens: bool = False) -> None:
    """LayerNorm weights away from 1 and biases away from 0 (and, with ``tokens``, the
    zero-initialised class / mask tokens random), so that a weight mapping is really tested."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g))
        if tokens:
            for name, p in model.named_parameters():
                if name.endswith(("cls_token", "mask_token")):
                    p.copy_(torch.randn(p.shape, generator=g))


def run_config(cfg: dict, *overrides: str):
    """Train a config given as a dict, with ``key=value`` overrides, as ``foundation train`` does."""
    from omegaconf import OmegaConf

    from foundation.engine.config import apply_override, resolve
    from foundation.engine.loop import train

    raw = OmegaConf.create(cfg)
    for o in overrides:
        apply_override(raw, o)
    return train(*resolve(raw))


def read_records(run_dir) -> list[dict]:
    """A run's metrics.jsonl, one dict a line."""
    import json
    from pathlib import Path

    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def write_vision_demo(parent, train_per_class: int = 8, val_per_class: int = 4):
    """A tiny ImageNet-layout folder under ``parent``: 3 classes of 16 px demo images."""
    from pathlib import Path

    from foundation_tasks.classification import demo

    root = Path(parent) / "demo"
    demo.write_dataset(root, seed=0, size=16, train_per_class=train_per_class, val_per_class=val_per_class,
                       num_classes=3)
    return root


def overfit_losses(model, task_id: str, batch, opt, steps: int) -> tuple[list[float], dict]:
    """Train ``model`` on one fixed batch: the losses of every step and the last step's logs."""
    losses, logs = [], {}
    for _ in range(steps):
        loss, logs = model(task_id, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, logs


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (the scripts are not a package: they run by path)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
