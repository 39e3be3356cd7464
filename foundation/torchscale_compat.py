"""Import torchscale 0.3.0 (the official Magneto/DeepNet code) next to our stack.

torchscale pins timm 0.6 and fairscale 0.4, which conflict with ours, so it is installed
with ``pip install --no-deps torchscale==0.3.0``. At import it needs only fairscale's
``checkpoint_wrapper`` and ``wrap`` (used when activation checkpointing or FSDP is asked
for); when fairscale is absent we register stand-ins that refuse to be used.
"""
from __future__ import annotations

import sys
import types


def _refuse(name: str):
    def fn(*args, **kwargs):
        raise RuntimeError(f"fairscale.nn.{name} is not installed; build torchscale models without it")

    return fn


def import_torchscale():
    """Return ``(EncoderConfig, Encoder)``; raises ImportError naming the install command."""
    try:
        import fairscale.nn  # noqa: F401
    except ImportError:
        nn_mod = types.ModuleType("fairscale.nn")
        nn_mod.checkpoint_wrapper = _refuse("checkpoint_wrapper")
        nn_mod.wrap = _refuse("wrap")
        pkg = types.ModuleType("fairscale")
        pkg.nn = nn_mod
        sys.modules.setdefault("fairscale", pkg)
        sys.modules.setdefault("fairscale.nn", nn_mod)
    try:
        from torchscale.architecture.config import EncoderConfig
        from torchscale.architecture.encoder import Encoder
    except ImportError as e:
        raise ImportError(
            f"torchscale is needed for this ({e}); install it with "
            "`pip install --no-deps torchscale==0.3.0 einops`"
        ) from e
    return EncoderConfig, Encoder
