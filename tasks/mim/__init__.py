"""mim: BEiT masked image modeling on visual token ids from a vq_tokenizer."""
from tasks.mim.task import MIM, MIMConfig

__all__ = ["MIM", "MIMConfig"]
