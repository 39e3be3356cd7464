"""nlvr2: NLVR2 fine-tuning of BEiT-3 (official json-lines layout, accuracy)."""
from foundation.engine.task import require_extra

require_extra("vl", "open_clip", "sentencepiece")  # before the imports below: one line naming the extra
from foundation_tasks.nlvr2.task import NLVR2, NLVR2Config

__all__ = ["NLVR2", "NLVR2Config"]
