"""vq_tokenizer: BEiT v2's VQ-KD visual tokenizer (codebook ids for MIM pretraining)."""
from foundation_tasks.vq_tokenizer.task import VQTokenizer, VQTokenizerConfig

__all__ = ["VQTokenizer", "VQTokenizerConfig"]
