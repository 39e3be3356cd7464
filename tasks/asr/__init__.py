"""asr: Transformer-Transducer speech recognition with the shared backbone as encoder."""
from tasks.asr.task import ASR, ASRConfig

__all__ = ["ASR", "ASRConfig"]
