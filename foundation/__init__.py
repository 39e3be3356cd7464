"""The Magneto foundation backbone shared by the vision, speech and vision-language tasks.

Importing the package registers ``magneto_*`` / ``preln_*`` ViT models with timm."""
from foundation.config import BackboneConfig, ConfigError
from foundation.transformer import Backbone
from foundation.vit import VisionTransformer, ViTConfig

__all__ = ["Backbone", "BackboneConfig", "ConfigError", "VisionTransformer", "ViTConfig"]
__version__ = "0.1.0"
