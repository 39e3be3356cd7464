"""vqa: VQA v2 fine-tuning of BEiT-3 (official json layout, official accuracy); its
``demo`` module writes the vision-language demo data (`foundation data make vl`)."""
from tasks.vqa.task import VQA, VQAConfig

__all__ = ["VQA", "VQAConfig"]
