"""vqa: VQA v2 fine-tuning of BEiT-3 (official json layout, official accuracy); its
``demo`` module writes the vision-language demo data (`foundation data make vl`)."""
from foundation.engine.task import require_extra

require_extra("vl", "open_clip", "sentencepiece")  # before the imports below: one line naming the extra
from foundation_tasks.vqa.task import VQA, VQAConfig

__all__ = ["VQA", "VQAConfig"]
