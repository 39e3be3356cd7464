"""UperNet around the shared backbone: image front end, mmseg's Feature2Pyramid neck,
UPerHead, auxiliary FCNHead and their losses, whole-image and sliding-window inference.

The head holds everything but the backbone (the engine's contract): the image front end
(``foundation.embed.ViTFrontEnd``, the ViT's and the other vision heads': ``patch_embed``,
``cls_token``, ``pos_embed``, so pretrained ViT / MIM weights load by name), the neck and the two decode heads.
The decode heads are mmseg's own modules and compute mmseg's own losses
(``loss_by_feat``: logits resized to the label, CrossEntropyLoss with ignore 255; the
auxiliary loss weighted 0.4) - mmseg's ``_base_/models/upernet_beit.py``.
"""
from __future__ import annotations

import types
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from foundation.embed import ViTFrontEnd
from foundation_tasks.segmentation import mmseg_compat

mmseg_compat.import_mmseg()

from mmengine.config import ConfigDict  # noqa: E402
from mmengine.model import normal_init  # noqa: E402
from mmengine.structures import PixelData  # noqa: E402
from mmseg.models.decode_heads import FCNHead, UPerHead  # noqa: E402
from mmseg.models.necks import Feature2Pyramid  # noqa: E402
from mmseg.models.segmentors import EncoderDecoder  # noqa: E402
from mmseg.structures import SegDataSample  # noqa: E402


def batch_norm_cfg(sync: bool) -> dict:
    """SyncBN (mmseg's choice) under multi-GPU data parallelism; BN otherwise: on one
    process they compute the same, and SyncBN refuses CPU tensors under torch.distributed."""
    dist = torch.distributed.is_available() and torch.distributed.is_initialized()
    if sync and dist and torch.distributed.get_backend() == "nccl":
        return dict(type="SyncBN", requires_grad=True)
    return dict(type="BN", requires_grad=True)


class ClassWeightedCE(nn.Module):
    """Cross-entropy with per-class weights, averaged over the labelled pixels by their weights
    (what mmseg's ``CrossEntropyLoss(class_weight=...)`` means). Its own implementation fails on any
    ignored pixel (it indexes the weights with label 255: open-mmlab/mmsegmentation#3734), so
    ``F.cross_entropy``, which does this reduction itself, stands in with mmseg's call signature."""

    loss_name = "loss_ce"

    def __init__(self, class_weight: Sequence[float], loss_weight: float = 1.0):
        super().__init__()
        self.register_buffer("class_weight", torch.tensor(list(class_weight), dtype=torch.float32), persistent=False)
        self.loss_weight = loss_weight

    def forward(self, logits: torch.Tensor, label: torch.Tensor, weight=None, ignore_index: int = 255) -> torch.Tensor:
        if weight is not None:
            raise ValueError("ClassWeightedCE takes no per-pixel weights (no pixel sampler in this head)")
        return self.loss_weight * F.cross_entropy(logits.float(), label, weight=self.class_weight.to(logits.device),
                                                  ignore_index=ignore_index)


class UperNetHead(ViTFrontEnd):
    """``head(backbone, batch) -> (loss, logs)``; ``logits(backbone, images)`` for inference."""

    def __init__(
        self,
        dim: int,
        num_classes: int,
        img_size: int,
        patch_size: int,
        *,
        out_indices: Sequence[int] = (3, 5, 7, 11),
        rescales: Sequence[float] = (4, 2, 1, 0.5),
        channels: int = 768,
        pool_scales: Sequence[int] = (1, 2, 3, 6),
        aux_channels: int = 256,
        aux_index: int = 2,
        aux_weight: float = 0.4,
        dropout_ratio: float = 0.1,
        class_token: bool = True,
        abs_pos_embed: bool = False,
        final_norm: bool = False,
        sync_bn: bool = True,
        pos_init: str = "trunc_normal",
        class_weight: Sequence[float] | None = None,
    ):
        # dynamic size: whole-image inference at any multiple of the patch size
        super().__init__(dim, img_size, patch_size, 3, pos_init, class_token=class_token, abs_pos_embed=abs_pos_embed,
                         dynamic_img_size=True)
        self.img_size, self.patch_size = img_size, patch_size
        self.num_classes, self.out_indices, self.final_norm = num_classes, list(out_indices), final_norm
        norm_cfg = batch_norm_cfg(sync_bn)
        ce = lambda weight: dict(type="CrossEntropyLoss", use_sigmoid=False, loss_weight=weight)  # noqa: E731
        self.neck = Feature2Pyramid(embed_dim=dim, rescales=list(rescales), norm_cfg=norm_cfg)
        self.decode_head = UPerHead(
            in_channels=[dim] * len(out_indices), in_index=list(range(len(out_indices))), pool_scales=tuple(pool_scales),
            channels=channels, dropout_ratio=dropout_ratio, num_classes=num_classes, norm_cfg=norm_cfg,
            align_corners=False, loss_decode=ce(1.0),
        )
        self.auxiliary_head = FCNHead(
            in_channels=dim, in_index=aux_index, channels=aux_channels, num_convs=1, concat_input=False,
            dropout_ratio=dropout_ratio, num_classes=num_classes, norm_cfg=norm_cfg, align_corners=False,
            loss_decode=ce(aux_weight),
        ) if aux_weight > 0 else None
        if class_weight is not None:
            for head in (self.decode_head, self.auxiliary_head):
                if head is not None:
                    head.loss_decode = ClassWeightedCE(class_weight, head.loss_decode.loss_weight)
        # mmseg's init_cfg of its decode heads: normal(0, 0.01) on the classifier conv
        for head in (self.decode_head, self.auxiliary_head):
            if head is not None:
                normal_init(head.conv_seg, mean=0.0, std=0.01, bias=0.0)

    # ------------------------------------------------------------------ features

    def features(self, backbone: nn.Module, images: torch.Tensor) -> list[torch.Tensor]:
        """The neck's four maps from blocks ``out_indices`` (BEiT's outputs: class token
        dropped, (B, D, H, W); the last block through the final LN when ``final_norm``)."""
        x, (H, W) = self.embed(images)
        final, hidden = backbone(x, return_layers=self.out_indices)
        depth = backbone.config.depth
        maps = []
        for i in self.out_indices:
            h = final if (self.final_norm and i % depth == depth - 1) else hidden[i]
            h = h[:, self.num_prefix_tokens:]
            maps.append(h.reshape(h.shape[0], H, W, -1).permute(0, 3, 1, 2))
        return self.neck(maps)

    # ------------------------------------------------------------------ training

    def forward(self, backbone: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        feats = self.features(backbone, batch["images"])
        samples = [SegDataSample(gt_sem_seg=PixelData(data=label[None])) for label in batch["labels"]]
        losses = self.decode_head.loss_by_feat(self.decode_head(feats), samples)
        logs = {"loss_ce": losses["loss_ce"].detach(), "acc_seg": losses["acc_seg"].detach()}  # acc in %
        loss = losses["loss_ce"]
        if self.auxiliary_head is not None:
            aux = self.auxiliary_head.loss_by_feat(self.auxiliary_head(feats), samples)
            loss = loss + aux["loss_ce"]
            logs["aux_loss_ce"] = aux["loss_ce"].detach()
        return loss, logs

    # ------------------------------------------------------------------ inference

    def logits(self, backbone: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """(B, K, H, W) class scores at the input's size (mmseg's ``encode_decode``)."""
        out = self.decode_head(self.features(backbone, images))
        return F.interpolate(out, size=images.shape[2:], mode="bilinear", align_corners=False)

    @torch.no_grad()
    def predict_logits(self, backbone: nn.Module, images: torch.Tensor, mode: str = "slide",
                       crop: int | None = None, stride: int | None = None) -> torch.Tensor:
        """Whole-image or sliding-window logits, computed by mmseg's own
        ``EncoderDecoder.whole_inference`` / ``slide_inference`` around our ``logits``.

        ``whole`` pads the image to a multiple of the patch size (and crops the logits back),
        as mmseg's test-time ``size_divisor``; with a relative position table the padded
        size must be the training crop. ``slide``: ``crop`` x ``crop`` windows every
        ``stride`` pixels, overlapping logits averaged."""
        encode = lambda img, metas: self.logits(backbone, img)  # noqa: E731
        if mode == "whole":
            H, W = images.shape[2:]
            p = self.patch_size
            padded = F.pad(images, (0, -W % p, 0, -H % p))
            return encode(padded, None)[:, :, :H, :W]
        if mode != "slide":
            raise ValueError(f"inference mode must be whole or slide, got {mode!r}")
        crop = crop or self.img_size
        stride = stride or crop
        segmentor = _segmentor_view(encode, self.num_classes, crop, stride)
        return EncoderDecoder.slide_inference(segmentor, images, [dict(img_shape=images.shape[2:])])


def _segmentor_view(encode: Callable, num_classes: int, crop: int, stride: int) -> types.SimpleNamespace:
    """The attributes mmseg's ``EncoderDecoder.slide_inference`` reads from its segmentor."""
    return types.SimpleNamespace(
        encode_decode=encode, out_channels=num_classes,
        test_cfg=ConfigDict(mode="slide", crop_size=(crop, crop), stride=(stride, stride)),
    )
