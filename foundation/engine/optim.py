"""AdamW with layer-wise lr decay, warmup + decay schedules, and an EMA of the weights."""
from __future__ import annotations

import contextlib
import fnmatch
import math
from typing import Callable, Collection, Iterator

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from foundation.engine.config import OptimConfig, ScheduleConfig
from foundation.engine.model import MultiTaskModel


def layer_ids(model: MultiTaskModel) -> tuple[dict[str, int], int]:
    """({parameter name: layer id}, number of blocks L), BEiT's numbering: 0 for the
    embeddings below the backbone, i + 1 for block i (encoder blocks first, then the
    decoder's), L + 1 for everything on top (heads, final norms, shared position bias)."""
    bb = model.backbone
    n_enc = len(bb.encoder.layers) if bb.encoder is not None else 0
    n_dec = len(bb.decoder.layers) if bb.decoder is not None else 0
    top = n_enc + n_dec + 1
    ids = {}
    for name, _ in model.named_parameters():
        parts = name.split(".")
        if parts[:3] == ["backbone", "encoder", "layers"]:
            ids[name] = int(parts[3]) + 1
        elif parts[:3] == ["backbone", "decoder", "layers"]:
            ids[name] = n_enc + int(parts[3]) + 1
        elif parts[0] == "heads":
            task = model.tasks[parts[1]]
            ids[name] = 0 if ".".join(parts[2:]).startswith(tuple(task.embedding_params)) else top
        else:
            ids[name] = top
    return ids, top - 1


def param_groups(model: MultiTaskModel, cfg: OptimConfig, pretrained: Collection[str] = ()) -> list[dict]:
    """One group per (layer, decay or not), each with its ``lr_scale`` already applied to
    its ``lr``: the scheduler multiplies each group's own initial lr, so the scale holds
    at every step (timm's groups only carry ``lr_scale`` for timm's schedulers to apply).
    With ``cfg.freeze_pretrained_steps``, the ``pretrained`` parameters (by name) form groups
    of their own that carry ``frozen_steps`` (``build_scheduler`` holds their lr at 0)."""
    ids, depth = layer_ids(model)
    hold = cfg.freeze_pretrained_steps if pretrained else 0
    no_decay = set()
    for tid, head in model.heads.items():
        if hasattr(head, "no_weight_decay"):
            no_decay.update(f"heads.{tid}.{n}" for n in head.no_weight_decay())
    groups: dict[tuple[int, bool], dict] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        decays = not (p.ndim <= 1 or name in no_decay or any(fnmatch.fnmatch(name, pat) for pat in cfg.no_weight_decay))
        layer = ids[name] if cfg.layer_decay is not None else 0
        scale = cfg.layer_decay ** (depth + 1 - layer) if cfg.layer_decay is not None else 1.0
        held = bool(hold) and name in pretrained
        # held groups sort first: the last group, whose lr the log shows, is one that trains
        group = groups.setdefault((layer, decays, not held), {
            "params": [], "weight_decay": cfg.weight_decay if decays else 0.0,
            "lr_scale": scale, "lr": cfg.lr * scale, "layer_id": layer, **({"frozen_steps": hold} if held else {}),
        })
        group["params"].append(p)
    return [groups[k] for k in sorted(groups)]


FUSED_DEVICES = ("cpu", "cuda")  # where torch's fused AdamW kernel runs


def build_optimizer(model: MultiTaskModel, cfg: OptimConfig, params: list[dict] | None = None,
                    pretrained: Collection[str] = ()) -> torch.optim.AdamW:
    """torch's AdamW, its fused kernel wherever every parameter allows it (CPU, CUDA): on a
    CPU torch's default is a per-tensor loop, 3.5-7x slower on the demo models
    (``benchmarks/optimizer_step.py``), a tenth of a tiny VL model's training step (its
    49k-row text embedding is updated every step). The same update up to float rounding."""
    groups = params or param_groups(model, cfg, pretrained)
    tensors = [p for g in groups for p in g["params"]]
    fused = all(p.device.type in FUSED_DEVICES and p.is_floating_point() for p in tensors) or None
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=fused)


def lr_factor(cfg: ScheduleConfig, peak_lr: float, total_steps: int) -> Callable[[int], float]:
    """step -> multiplier of each group's peak lr: linear warmup from 0, then decay to
    ``min_lr`` at ``total_steps``."""
    floor = cfg.min_lr / peak_lr

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.name == "constant":
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
        shape = {
            "cosine": 0.5 * (1.0 + math.cos(math.pi * progress)),
            "linear": 1.0 - progress,
            "poly": (1.0 - progress) ** cfg.power,
        }[cfg.name]
        return floor + (1.0 - floor) * shape

    return factor  # a plain function: LambdaLR's state then holds only counters


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: ScheduleConfig, peak_lr: float, total_steps: int) -> LambdaLR:
    """The schedule for every group; a group with ``frozen_steps`` N gets lr 0 for its first N
    steps, then the schedule's value at that step (Adam's moments kept following its gradients)."""
    factor = lr_factor(cfg, peak_lr, total_steps)
    holds = [g.get("frozen_steps", 0) for g in optimizer.param_groups]
    if not any(holds):
        return LambdaLR(optimizer, factor)
    return LambdaLR(optimizer, [held(factor, n) if n else factor for n in holds])


def held(factor: Callable[[int], float], steps: int) -> Callable[[int], float]:
    def frozen_then(step: int) -> float:
        return 0.0 if step < steps else factor(step)

    return frozen_then


class EMA:
    """Exponential moving average of a model's floating-point state (BEiT / timm style)."""

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.shadow = {k: v.detach().clone() for k, v in model.state_dict().items()}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        for k, v in model.state_dict().items():
            if v.is_floating_point():
                self.shadow[k].lerp_(v.detach(), 1.0 - self.decay)
            else:
                self.shadow[k].copy_(v)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.shadow)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        missing = set(self.shadow) ^ set(state)
        if missing:
            raise KeyError(f"EMA state does not match the model: {sorted(missing)[:5]}")
        for k, v in state.items():
            self.shadow[k].copy_(v)

    @contextlib.contextmanager
    def applied(self, model: nn.Module) -> Iterator[None]:
        """The model holds the EMA weights inside the block, its own weights after."""
        own = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.load_state_dict(self.shadow)
        try:
            yield
        finally:
            model.load_state_dict(own)


def grad_total_norm(params, max_norm: float | None) -> torch.Tensor:
    """The gradients' total L2 norm, clipping them to ``max_norm`` where one is set; without
    one, the norm alone (clipping to inf would still rescale every gradient by 1.0)."""
    params = list(params)
    if max_norm is not None or not hasattr(torch.nn.utils, "get_total_norm"):  # the latter: torch < 2.6
        return torch.nn.utils.clip_grad_norm_(params, math.inf if max_norm is None else max_norm)
    return torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
