"""mim: BEiT masked image modeling on visual token ids from a vq_tokenizer."""
from foundation_tasks.mim.task import MIM, MIMConfig

__all__ = ["MIM", "MIMConfig"]
