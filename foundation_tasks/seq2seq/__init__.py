"""seq2seq: reverse or sort token sequences with an encoder-decoder backbone."""
from foundation_tasks.seq2seq.task import Seq2Seq, Seq2SeqConfig

__all__ = ["Seq2Seq", "Seq2SeqConfig"]
