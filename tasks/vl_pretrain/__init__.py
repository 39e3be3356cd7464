"""vl_pretrain: BEiT-3's masked data modeling over texts, images and image-text pairs."""
from tasks.vl_pretrain.task import VLPretrain, VLPretrainConfig

__all__ = ["VLPretrain", "VLPretrainConfig"]
