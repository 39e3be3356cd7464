"""segmentation: ADE20k semantic segmentation with UperNet through mmsegmentation 1.x.

``tasks.segmentation.mmseg_compat`` makes mmseg import on mmcv-lite (read it first);
``mmseg_backbone`` registers ``MagnetoViT`` and its layer-decay optimizer constructor in
mmseg; ``task`` is the engine task (``name: segmentation``).
"""
from tasks.segmentation.task import Segmentation, SegmentationConfig

__all__ = ["Segmentation", "SegmentationConfig"]
