"""Makes ``from mmseg.apis import init_model`` work as the first line of a program on
mmcv-lite, with nothing of ours imported before it.

mmseg imports ``mmcv.ops`` at module level, which mmcv-lite cannot import (see
``mmseg_compat``), so its stand-in must be in place before mmseg's first import. The
package installs ``foundation_mmseg.pth`` into site-packages; at interpreter start-up it
runs ``register()`` from this file (loaded by path: importing ``foundation_tasks.segmentation`` would
import torch and mmseg at every start). ``register()`` only adds an import hook to
``sys.meta_path``; the first ``import mmseg`` calls ``mmseg_compat.install()`` (which steps
aside on full mmcv), removes the hook and lets the import go on as usual.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

COMPAT = "foundation_tasks.segmentation.mmseg_compat"


def load_compat():
    """``foundation_tasks.segmentation.mmseg_compat`` without importing its package (one module object:
    a later ``from foundation_tasks.segmentation import mmseg_compat`` gets this one)."""
    if COMPAT in sys.modules:
        return sys.modules[COMPAT]
    spec = importlib.util.spec_from_file_location(COMPAT, Path(__file__).with_name("mmseg_compat.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[COMPAT] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[COMPAT]
        raise
    return module


class BeforeMmseg:
    """A meta path finder that finds nothing: it only acts when ``mmseg`` is first imported."""

    def find_spec(self, name, path=None, target=None):
        if name == "mmseg":
            uninstall()
            # without the segmentation extra (no mmcv) there is nothing to stand in for: the
            # lookup goes on and fails or succeeds as it would without this hook
            if importlib.util.find_spec("mmcv") is not None:
                load_compat().install()
        return None


def _is_hook(finder) -> bool:  # by name: a second copy of this file defines another class
    return type(finder).__name__ == BeforeMmseg.__name__


def register() -> None:
    if "mmseg" not in sys.modules and not any(map(_is_hook, sys.meta_path)):
        sys.meta_path.insert(0, BeforeMmseg())


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not _is_hook(f)]
