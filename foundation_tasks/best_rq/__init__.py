"""best_rq: BEST-RQ masked speech prediction (random-projection quantizer targets)."""
from foundation.engine.task import require_extra

require_extra("speech", "espnet2", "torchaudio", "soundfile")  # before the imports below: one line naming the extra
from foundation_tasks.best_rq.task import BestRQ, BestRQConfig

__all__ = ["BestRQ", "BestRQConfig"]
