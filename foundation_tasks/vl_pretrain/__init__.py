"""vl_pretrain: BEiT-3's masked data modeling over texts, images and image-text pairs."""
from foundation.engine.task import require_extra

require_extra("vl", "open_clip", "sentencepiece")  # before the imports below: one line naming the extra
from foundation_tasks.vl_pretrain.task import VLPretrain, VLPretrainConfig

__all__ = ["VLPretrain", "VLPretrainConfig"]
