"""asr: Transformer-Transducer speech recognition with the shared backbone as encoder."""
from foundation.engine.task import require_extra

require_extra("speech", "espnet2", "torchaudio", "sentencepiece", "editdistance", "soundfile")  # before the imports below: one line naming the extra
from foundation_tasks.asr.task import ASR, ASRConfig

__all__ = ["ASR", "ASRConfig"]
