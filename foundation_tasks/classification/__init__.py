"""classification: image classification fine-tuning on ImageNet-layout folders (BEiT recipe)."""
from foundation_tasks.classification.task import Classification, ClassificationConfig

__all__ = ["Classification", "ClassificationConfig"]
