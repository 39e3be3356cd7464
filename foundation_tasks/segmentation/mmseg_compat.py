"""mmsegmentation 1.x on ``mmcv-lite``: the one compatibility step, and nothing else.

Why this exists. ``mmcv-lite`` is mmcv without its compiled extension (``mmcv._ext``).
Its ``mmcv/ops/__init__.py`` imports every op eagerly and most of them load the
extension at import, so ``import mmcv.ops`` fails. mmseg 1.2.2 imports ``mmcv.ops`` at
module level in four places (``mmseg/utils/mask_classification.py``,
``models/utils/point_sample.py``, ``models/decode_heads/san_head.py``,
``models/losses/focal_loss.py``), so ``import mmseg.models`` fails although the modules
we use (ADE20KDataset and its transforms, Feature2Pyramid, UPerHead, FCNHead,
EncoderDecoder, IoUMetric) need no compiled op. Building full mmcv from source takes
long on small machines and mmseg 1.2.2 rejects the prebuilt mmcv 2.2.0.

What it does. ``install()`` puts a *lazy* ``mmcv.ops`` package in ``sys.modules``
before mmseg is imported. It is mmcv-lite's own ``mmcv/ops`` directory (same
``__path__``, same submodules), minus the eager ``__init__``: a name such as
``point_sample`` is imported from the submodule that the real ``__init__`` imports it
from (read from that file, not hard-coded) the first time it is looked up. Ops written
in pure PyTorch (``point_sample``, ``bilinear_grid_sample``, ...) are therefore mmcv's own
code and work. An op whose submodule needs ``mmcv._ext`` behaves as a missing compiled
op: ``from mmcv.ops import nms`` raises ``MissingCompiledOp``, a ``ModuleNotFoundError``
naming the op and the fix, so code written for optional ops (``try: from mmcv.ops import
nms / except ImportError: <fallback>``) takes its fallback. mmseg's own modules alone get
a placeholder class instead, which raises ``MissingCompiledOp`` when *used* (called,
instantiated): mmseg's ``focal_loss.py`` imports ``sigmoid_focal_loss`` unconditionally,
and ``import mmseg.models`` must still work.

It steps aside - changes nothing - when the compiled extension is importable (full
``mmcv`` installed) or when ``mmcv.ops`` was already imported by someone else.

Not handled here, on purpose: mmengine 0.10.7 calls ``torch.load`` without
``weights_only`` and torch >= 2.6 defaults to ``weights_only=True``, which refuses the
runner's own ``iter_N.pth`` files (their message hub pickles bound methods through
``getattr``; allow-listing ``getattr`` would make safe loading meaningless). Resuming or
testing *your own* mmengine checkpoints therefore needs torch's documented switch
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``; pretrained weights for ``MagnetoViT`` are
safetensors and never unpickled.

``import_mmseg()`` installs, imports ``mmseg.models`` / ``mmseg.datasets`` /
``mmseg.evaluation`` and registers our own mmseg modules (``foundation_tasks.segmentation.mmseg_backbone``).
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
import types
import warnings
from pathlib import Path

__all__ = ["MissingCompiledOp", "install", "import_mmseg", "ops_are_stand_in"]

_STAND_IN_FLAG = "__foundation_stand_in__"


class MissingCompiledOp(ModuleNotFoundError):
    """An mmcv op that needs mmcv's compiled extension (``mmcv._ext``), which mmcv-lite
    lacks, was imported or used. A ``ModuleNotFoundError`` (so an ``ImportError``), as a
    missing compiled module is."""


def _has_compiled_ops() -> bool:
    try:
        return importlib.util.find_spec("mmcv._ext") is not None
    except (ImportError, ValueError):
        return False


def ops_are_stand_in() -> bool:
    """True when ``mmcv.ops`` is this module's lazy stand-in."""
    mod = sys.modules.get("mmcv.ops")
    return mod is not None and getattr(mod, _STAND_IN_FLAG, False)


def _export_map(init_file: Path) -> dict[str, str]:
    """{exported name: submodule} from the ``from .x import a, b`` lines of mmcv/ops/__init__.py
    (top level only: the MLU-only block is skipped)."""
    tree = ast.parse(init_file.read_text(encoding="utf-8"))
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = node.module
    return names


def _missing_message(name: str, submodule: str, error: BaseException) -> str:
    return (
        f"mmcv.ops.{name} needs mmcv's compiled extension, which this environment lacks "
        f"(mmcv-lite; importing mmcv.ops.{submodule} failed with: {error}). The modules of "
        "foundation's segmentation task do not use it; for this op install mmcv 2.1.0 with "
        "its ops compiled (pip install mmcv==2.1.0, which builds from source), after which "
        "foundation_tasks.segmentation.mmseg_compat steps aside."
    )


def _placeholder(name: str, submodule: str, error: BaseException) -> type:
    """A class standing for an op that cannot load, for mmseg's own modules: importing it
    works; calling or instantiating it raises. A class (not a function) keeps
    ``isinstance`` checks and subclassing in other code valid."""
    message = _missing_message(name, submodule, error)

    def refuse(*args, **kwargs):
        raise MissingCompiledOp(message, name="mmcv._ext")

    return type(name, (), {"__new__": refuse, "__doc__": message, "__module__": f"mmcv.ops.{submodule}",
                           "__missing_compiled_op__": True})


def _stand_in(ops_dir: Path) -> types.ModuleType:
    exports = _export_map(ops_dir / "__init__.py")
    module = types.ModuleType("mmcv.ops", "mmcv.ops without its eager __init__ (see foundation_tasks.segmentation.mmseg_compat)")
    module.__path__ = [str(ops_dir)]  # submodules import from mmcv-lite's own files
    module.__file__ = str(ops_dir / "__init__.py")
    module.__package__ = "mmcv.ops"
    module.__all__ = sorted(exports)
    setattr(module, _STAND_IN_FLAG, True)

    def __getattr__(name: str):
        # dunders and unknown names: AttributeError, as Python's import machinery and
        # `from mmcv.ops import X` expect
        if name.startswith("__") or name not in exports:
            raise AttributeError(f"module 'mmcv.ops' has no attribute {name!r}")
        submodule = exports[name]
        try:
            value = getattr(importlib.import_module(f"mmcv.ops.{submodule}"), name)
        except (ImportError, AttributeError, OSError, AssertionError) as e:
            if _imported_by_mmseg():  # not cached: anyone else gets the ImportError
                return _placeholder(name, submodule, e)
            raise MissingCompiledOp(_missing_message(name, submodule, e), name="mmcv._ext") from None
        # importing the submodule bound its module object to the package attribute of the
        # same name (e.g. point_sample); the exported object replaces it, as in mmcv's __init__
        setattr(module, name, value)
        return value

    module.__getattr__ = __getattr__
    return module


def _imported_by_mmseg() -> bool:
    """Whether the code looking up an mmcv.ops name (past the import machinery) is mmseg's."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("importlib"):
        frame = frame.f_back
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    return name == "mmseg" or name.startswith("mmseg.")


def install() -> bool:
    """Make ``import mmseg.models`` work on mmcv-lite. Returns True when the stand-in was
    installed now or earlier, False when real mmcv ops are in use (nothing changed)."""
    if ops_are_stand_in():
        return True
    if "mmcv.ops" in sys.modules or _has_compiled_ops():
        return False  # full mmcv, or someone imported mmcv.ops successfully: step aside
    import mmcv

    ops_dir = Path(mmcv.__file__).parent / "ops"
    if not (ops_dir / "__init__.py").is_file():
        return False
    module = _stand_in(ops_dir)
    sys.modules["mmcv.ops"] = module
    mmcv.ops = module
    return True


_IMPORTED = False


def import_mmseg() -> None:
    """``install()``, then import mmseg's models, datasets and metrics and register ours
    (MagnetoViT, its optimizer constructor, the checked annotation loader)."""
    global _IMPORTED
    if _IMPORTED:
        return
    install()
    with warnings.catch_warnings():
        # mmcv-lite's own notice that its deformable attention (an op we do not use) is absent
        warnings.filterwarnings("ignore", message=".*MultiScaleDeformableAttention.*")
        importlib.import_module("mmseg.models")
    importlib.import_module("mmseg.datasets")
    importlib.import_module("mmseg.evaluation")
    importlib.import_module("foundation_tasks.segmentation.mmseg_backbone")
    _IMPORTED = True
