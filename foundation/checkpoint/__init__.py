"""Model files: safetensors weights plus the config that built them, and converters.

* ``format``: the file format, the registry of model kinds, ``save`` / ``load`` /
  ``read_config`` / ``read_meta``, strict loading (``load_state_into``), ``sub_state``;
* ``io``: atomic, durable writes (``atomic_write``, ``fsync_path``);
* ``torchscale``: torchscale 0.3.0's ``Encoder`` <-> our ``Backbone`` (``from_torchscale``,
  ``to_torchscale``, ``torchscale_args``, ``import_torchscale``);
* ``timm``: ``from_timm``, a timm ``VisionTransformer`` -> our ``VisionTransformer``
  (import it from ``foundation.checkpoint.timm``: it needs ``foundation.vit``, which itself
  registers its kind here, so this package does not import it).

Training state for resume (optimizer, RNG, ...) is the engine's: ``foundation.engine.run_state``.
"""
from foundation.checkpoint.format import (
    FORMAT_VERSION,
    META_CONFIG,
    META_EXTRA,
    META_FORMAT,
    META_KIND,
    META_MODULE,
    MODEL_KINDS,
    CheckpointError,
    ModelKind,
    load,
    load_state_into,
    read_config,
    read_meta,
    register_model_kind,
    save,
    sub_state,
)
from foundation.checkpoint.io import atomic_write, fsync_path
from foundation.checkpoint.torchscale import (
    TORCHSCALE_OUTSIDE,
    from_torchscale,
    import_torchscale,
    to_torchscale,
    torchscale_args,
    torchscale_config,
    torchscale_norm_flags,
)

__all__ = [
    "FORMAT_VERSION", "META_CONFIG", "META_EXTRA", "META_FORMAT", "META_KIND", "META_MODULE", "MODEL_KINDS",
    "CheckpointError", "ModelKind", "load", "load_state_into", "read_config", "read_meta", "register_model_kind",
    "save", "sub_state", "atomic_write", "fsync_path", "TORCHSCALE_OUTSIDE", "from_torchscale", "import_torchscale",
    "to_torchscale", "torchscale_args", "torchscale_config", "torchscale_norm_flags",
]
