"""The Magneto foundation backbone shared by the vision, speech and vision-language tasks."""
from foundation.config import BackboneConfig, ConfigError
from foundation.transformer import Backbone

__all__ = ["Backbone", "BackboneConfig", "ConfigError"]
__version__ = "0.1.0"
