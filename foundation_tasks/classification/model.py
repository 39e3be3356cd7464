"""The image classification head on the shared ViT front end.

Parameter names follow ``foundation.vit.VisionTransformer`` (``patch_embed``,
``cls_token``, ``pos_embed``, ``fc_norm``, ``head``): the MIM and tokenizer heads use the
same front end (``foundation.embed.ViTFrontEnd``), so pretrained front-end weights load into
the classifier by name, and a classification head plus its backbone is a
``VisionTransformer`` state dict (see ``to_vit``), loadable through timm's registry.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from timm.models.vision_transformer import global_pool_nlc
from torch import nn

from foundation.embed import ViTFrontEnd


class ClassificationHead(ViTFrontEnd):
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
        # timm's pooling, as foundation.vit.VisionTransformer.pool: to_vit() gives the same logits
        return self.fc_norm(global_pool_nlc(hidden, pool_type=self.global_pool, num_prefix_tokens=1))

    def logits(self, backbone: nn.Module, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(backbone(self.embed(images)[0])))

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
