"""A trained tokenizer, frozen, as MIM and VL pretraining use it: images in, visual token ids out.

``load_tokenizer(path)`` reads a tokenizer run's ``model.safetensors`` (or a BEiT v2
tokenizer converted by ``foundation_tasks.vq_tokenizer.convert``): the backbone (its encoder) and
the ``vq_tokenizer`` head (``vqkd.VQKDHead``), without the teacher, which encoding does not
need. The run's config is read through the engine's task registry, as any checkpoint's.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from torch import nn

from foundation import checkpoint
from foundation.checkpoint import CheckpointError
from foundation.transformer import Backbone
from foundation_tasks.vision_common.vqkd import build_vqkd


class FrozenTokenizer(nn.Module):
    def __init__(self, backbone: Backbone, head: nn.Module, img_size: int, patch_size: int):
        super().__init__()
        self.backbone, self.head = backbone, head
        self.img_size, self.patch_size = img_size, patch_size
        self.requires_grad_(False).eval()

    @property
    def num_codes(self) -> int:
        return self.head.quantize.num_codes

    @property
    def grid(self) -> tuple[int, int]:
        return self.head.grid

    def train(self, mode: bool = True) -> "FrozenTokenizer":
        return super().train(False)  # never updates its codebook

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) ImageNet-normalised -> ids (B, N)."""
        return self.head.encode_ids(self.backbone, images)


def load_tokenizer(path: str | Path, task_id: Optional[str] = None) -> FrozenTokenizer:
    """The ``vq_tokenizer`` head (``task_id``, default the only one) and backbone of a run checkpoint."""
    from foundation.engine import model as _engine_model  # noqa: F401  registers the MultiTaskModel kind
    from foundation.engine.config import task_specs

    path = Path(path)
    kind, config = checkpoint.read_config(path)
    if kind != "MultiTaskModel":
        raise CheckpointError(f"{path}: a {kind} checkpoint, not a run with a vq_tokenizer task")
    specs = [s for s in task_specs(config.tasks, str(path)) if s.name == "vq_tokenizer"]
    if task_id is not None:
        specs = [s for s in specs if s.id == task_id]
    if len(specs) != 1:
        what = f"task {task_id!r}" if task_id else "exactly one vq_tokenizer task"
        raise CheckpointError(f"{path}: expected {what}; its tasks: "
                              f"{', '.join(str(t.get('id') or t.get('name')) for t in config.tasks)}")
    spec = specs[0]
    from safetensors.torch import load_file

    prefix = f"heads.{spec.id}."
    state = {("head." + k[len(prefix):] if k.startswith(prefix) else k): v for k, v in load_file(str(path)).items()
             if k.startswith((prefix, "backbone."))}
    decoder_out = state.get("head.decode_task_layer.2.weight")
    if decoder_out is None:
        raise CheckpointError(f"{path}: no {prefix}decode_task_layer.2.weight: not a VQ-KD tokenizer head")
    c = spec.config
    with torch.random.fork_rng(devices=[]):  # building initialises weights: leave the caller's RNG alone
        # the decoder's output size is the teacher's feature size, read off the weights so
        # that the teacher (CLIP) is never looked up
        head = build_vqkd(c, config.backbone, target_dim=decoder_out.shape[0])
        tok = FrozenTokenizer(Backbone(config.backbone), head, c.img_size, c.patch_size)
    if tok.head.quantize.codebook.is_meta:
        # built under checkpoint._check_fits's meta device (a MIM run's shapes being checked):
        # nothing to copy into, and torch would warn once per tensor
        return tok
    checkpoint.load_state_into(tok, state, where=f"{path} (tokenizer {spec.id!r})")
    if not bool(tok.head.quantize.initted):
        raise CheckpointError(f"{path}: the tokenizer's codebook was never initialised (no training step)")
    return tok
