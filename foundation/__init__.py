"""The Magneto foundation backbone shared by the vision, speech and vision-language tasks.

Importing the package registers ``magneto_*`` / ``preln_*`` ViT models with timm."""
from foundation.config import BackboneConfig, ConfigError
from foundation.transformer import Backbone
from foundation.vit import VisionTransformer, ViTConfig

__all__ = ["Backbone", "BackboneConfig", "ConfigError", "VisionTransformer", "ViTConfig", "load_predictor"]


def __getattr__(name: str):
    # the predictor pulls in the engine (and, on use, a task): only when asked for
    if name == "load_predictor":
        from foundation.engine.predict import load_predictor

        return load_predictor
    raise AttributeError(f"module 'foundation' has no attribute {name!r}")
__version__ = "0.1.0"
