"""nlvr2: NLVR2 fine-tuning of BEiT-3 (official json-lines layout, accuracy)."""
from tasks.nlvr2.task import NLVR2, NLVR2Config

__all__ = ["NLVR2", "NLVR2Config"]
