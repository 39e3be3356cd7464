"""best_rq: BEST-RQ masked speech prediction (random-projection quantizer targets)."""
from tasks.best_rq.task import BestRQ, BestRQConfig

__all__ = ["BestRQ", "BestRQConfig"]
