"""The vision front end every vision head shares, and the image classification head.

Parameter names follow ``foundation.vit.VisionTransformer`` (``patch_embed``,
``cls_token``, ``pos_embed``, ``fc_norm``, ``head``): the MIM and tokenizer heads use the
same front end, so pretrained front-end weights load into the classifier by name, and a
classification head plus its backbone is a ``VisionTransformer`` state dict (see
``to_vit_state``), loadable through timm's registry.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from timm.data import Mixup
from timm.layers import resample_abs_pos_embed
from timm.loss import SoftTargetCrossEntropy
from torch import nn

from foundation.embed import PatchEmbed
from tasks.vision_common.pos_embed import POS_INITS, init_pos_embed  # noqa: F401 (re-exported)

FRONT_END = ("patch_embed.", "cls_token", "pos_embed")  # names (prefixes) of the front end's tensors


class ImageEmbedding(nn.Module):
    """Pixels -> ``(B, 1 + H*W, D)`` tokens: timm's conv patchifier, a class token and a
    learned absolute position embedding (ViT / BEiT v2 with ``use_abs_pos_emb``).

    ``pos_init``: ``trunc_normal`` (std 0.02, ViT / BEiT) or ``sincos`` (the patches' rows
    start as timm's 2-D sin-cos table, std ~0.5, still learned: MAE / MoCo v3). From
    scratch, Magneto's first block already outputs ~4x the embedding's scale (Sub-LN and
    the gamma-scaled init), so a 0.02 position signal takes hundreds of steps to matter."""

    def __init__(self, dim: int, img_size: int, patch_size: int, in_chans: int = 3, pos_init: str = "trunc_normal"):
        super().__init__()
        self.patch_embed = PatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches + 1, dim))
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        init_pos_embed(self.pos_embed, self.patch_embed.grid_size, self.num_prefix_tokens, pos_init)

    num_prefix_tokens = 1

    @property
    def grid(self) -> tuple[int, int]:
        return tuple(self.patch_embed.grid_size)

    def patches(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, 3, H, W)`` -> patch embeddings ``(B, N, D)`` (no class token, no positions)."""
        if images.dim() != 4:
            raise ValueError(f"images: expected (B, C, H, W), got shape {tuple(images.shape)}")
        return self.patch_embed(images)

    def tokens(self, patches: torch.Tensor) -> torch.Tensor:
        """Class token + patches, plus the position embedding."""
        cls = self.cls_token.expand(patches.shape[0], -1, -1)
        return torch.cat([cls, patches], dim=1) + self.pos_embed

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        return self.tokens(self.patches(images))

    def no_weight_decay(self) -> set[str]:
        return {"cls_token", "pos_embed"}


class ClassificationHead(ImageEmbedding):
    """Front end + mean-pooled (BEiT) or class-token head; Mixup/CutMix and label
    smoothing in training (timm's ``Mixup`` + ``SoftTargetCrossEntropy``)."""

    def __init__(self, dim: int, num_classes: int, img_size: int, patch_size: int, *, global_pool: str = "avg",
                 fc_norm: bool = True, head_init_scale: float = 0.001, label_smoothing: float = 0.1,
                 mixup: Mixup | None = None, eps: float = 1e-5, pos_init: str = "trunc_normal"):
        super().__init__(dim, img_size, patch_size, pos_init=pos_init)
        self.global_pool = global_pool
        self.fc_norm = nn.LayerNorm(dim, eps=eps) if fc_norm else nn.Identity()
        self.head = nn.Linear(dim, num_classes)
        # BEiT: a small head at the start keeps the pretrained features from being wrecked
        nn.init.trunc_normal_(self.head.weight, std=0.02)
        with torch.no_grad():
            self.head.weight.mul_(head_init_scale)
        nn.init.zeros_(self.head.bias)
        self.label_smoothing = label_smoothing
        self.mixup = mixup

    def pool(self, hidden: torch.Tensor) -> torch.Tensor:
        x = hidden[:, 1:].mean(1) if self.global_pool == "avg" else hidden[:, 0]
        return self.fc_norm(x)

    def logits(self, backbone: nn.Module, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(backbone(self.embed(images))))

    def forward(self, backbone: nn.Module, batch: dict[str, torch.Tensor]):
        images, labels = batch["images"], batch["labels"]
        if self.training and self.mixup is not None:
            if images.shape[0] % 2:
                raise ValueError(f"Mixup/CutMix pairs the batch with its reverse: the batch size must be even "
                                 f"(got {images.shape[0]}); change train.batch_size or set mixup: 0, cutmix: 0")
            images, soft = self.mixup(images, labels)
            logits = self.logits(backbone, images)
            return SoftTargetCrossEntropy()(logits.float(), soft), {}
        logits = self.logits(backbone, images)
        loss = F.cross_entropy(logits.float(), labels, label_smoothing=self.label_smoothing if self.training else 0.0)
        return loss, {"acc": (logits.argmax(-1) == labels).float().mean().detach()}


# --------------------------------------------------------------------------- pretrained front ends


def _head_prefixes(state: dict[str, torch.Tensor]) -> list[str]:
    """Prefixes under which a file holds a vision front end: "" for a VisionTransformer
    file, "heads.<id>." for each vision head of one of our runs."""
    return sorted(k[: -len("patch_embed.proj.weight")] for k in state if k.endswith("patch_embed.proj.weight")
                  and (k == "patch_embed.proj.weight" or k.count(".") == 4 and k.startswith("heads.")))


def load_front_end(head: ImageEmbedding, path: str | Path, log: Callable[[str], None] = print) -> dict[str, list[str]]:
    """Copy ``patch_embed`` / ``cls_token`` / ``pos_embed`` from a checkpoint into ``head``.

    The file is a run's ``model.safetensors`` (a MIM, tokenizer or classification run: its
    one vision head's front end is used) or a ``VisionTransformer`` file. The position
    embedding is resampled when the patch grids differ. Returns (and logs) what was
    loaded, what kept its initialisation and which tensors of the source head were left.
    """
    from safetensors.torch import load_file

    state = load_file(str(path))
    prefixes = _head_prefixes(state)
    if len(prefixes) != 1:
        found = ", ".join(p or "(top level)" for p in prefixes) or "none"
        raise ValueError(f"{path}: expected one vision front end (patch_embed.proj.weight), found {found}")
    prefix = prefixes[0]
    source = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix) and not k.startswith("backbone.")}
    own = head.state_dict()
    loaded, fitted = [], {}
    for name in own:
        if not name.startswith(FRONT_END) or name not in source:
            continue
        value = source[name]
        if name == "pos_embed" and value.shape != own[name].shape and value.shape[-1] == own[name].shape[-1]:
            value = resample_abs_pos_embed(value, list(head.grid), num_prefix_tokens=head.num_prefix_tokens)
        if value.shape != own[name].shape:
            raise ValueError(f"{path}: {prefix}{name} has shape {tuple(source[name].shape)}, this head needs "
                             f"{tuple(own[name].shape)}")
        fitted[name] = value
        loaded.append(name)
    head.load_state_dict(fitted, strict=False)
    report = {
        "loaded": loaded,
        "missing": [k for k in own if k not in fitted],
        "unused": [k for k in source if k not in fitted],
    }
    log(f"front end from {path} ({prefix or 'top level'}): loaded {', '.join(loaded) or 'nothing'}; "
        f"kept their initialisation: {', '.join(report['missing']) or 'none'}; "
        f"not used: {', '.join(report['unused']) or 'none'}")
    return report


def to_vit(model: nn.Module, head_id: str = "classification") -> nn.Module:
    """A fine-tuned classification run (a ``MultiTaskModel``) as a ``foundation.vit.VisionTransformer``
    computing the same logits: the same tensor names, without the ``heads.<id>.`` prefix.
    ``foundation.checkpoint.save`` writes it in the format timm's registry loads (what
    ``foundation export timm RUN_DIR --out FILE`` does): ``timm.create_model(
    "magneto_tiny_patch16_224", pretrained=True, pretrained_cfg_overlay=dict(file=FILE))``
    builds the file's architecture."""
    from foundation import checkpoint
    from foundation.vit import VisionTransformer, ViTConfig

    c = model.tasks[head_id].cfg
    vit = VisionTransformer(ViTConfig(backbone=model.backbone.config, img_size=c.img_size, patch_size=c.patch_size,
                                      num_classes=c.num_classes, global_pool=c.global_pool, fc_norm=c.fc_norm))
    prefix = f"heads.{head_id}."
    state = {k: v for k, v in model.state_dict().items() if k.startswith("backbone.")}
    state.update({k[len(prefix):]: v for k, v in model.state_dict().items() if k.startswith(prefix)})
    checkpoint.load_state_into(vit, state, where=f"classification head {head_id!r}")
    return vit.train(model.training)
