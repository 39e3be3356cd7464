"""segmentation: ADE20k semantic segmentation with UperNet through mmsegmentation 1.x.

``foundation_tasks.segmentation.mmseg_compat`` makes mmseg import on mmcv-lite (read it first);
``mmseg_backbone`` registers ``MagnetoViT`` and its layer-decay optimizer constructor in
mmseg; ``task`` is the engine task (``name: segmentation``).
"""
from foundation.engine.task import require_extra

require_extra("segmentation", "mmseg", "mmengine", "mmcv")  # before the imports below: one line naming the extra
from foundation_tasks.segmentation.task import Segmentation, SegmentationConfig

__all__ = ["Segmentation", "SegmentationConfig"]
