"""The checkpoint file: safetensors weights plus the config that built them.

A checkpoint is one ``.safetensors`` file. Its metadata holds the model kind (a name in
``MODEL_KINDS``) and the model's config as JSON, so ``load(path)`` rebuilds the model
from the file alone. Kinds are an explicit registry: a file names a kind, never a class
path, and nothing is ever unpickled. The file also names the module whose import
registers its kind (``foundation.module``); ``load`` imports it when the kind is not yet
registered, but only a module of this project's own packages (``foundation``, ``foundation_tasks``),
so a run's ``MultiTaskModel``, a ``VisionTransformer`` or a ``BEiT3`` loads with no import
first, and this module depends on none of them.

What *using* the model needs beyond its weights (class names, image statistics, a
tokenizer, ...) travels in the same file: a model with an ``export_meta()`` method
returns ``{section: {key: value}}`` (JSON values, or ``bytes`` such as a sentencepiece
model), written as JSON into the metadata (``foundation.meta``; bytes base64-encoded).
``read_meta(path)`` gives it back, and ``load`` keeps it on the model as ``saved_meta``
(a model rebuilt from a file writes the same metadata again when it is saved).

A file is data, not trusted: ``load`` and ``read_config`` build the config's model on the
meta device first and refuse, in one ``CheckpointError`` line, a config whose tensors are
not exactly the file's (``_check_fits``), so a forged ``dim: 32768`` allocates nothing.
"""
from __future__ import annotations

import base64
import importlib
import json
import math
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from foundation.checkpoint.io import atomic_write
from foundation.config import BackboneConfig, to_dict
from foundation.transformer import Backbone

FORMAT_VERSION = "1"
# metadata keys of our files
META_FORMAT, META_KIND, META_CONFIG = "foundation.format", "foundation.kind", "foundation.config"
META_MODULE = "foundation.module"  # the module whose import registers the file's kind
META_EXTRA = "foundation.meta"  # what prediction needs: {section: {key: value}} as JSON
_BYTES = "base64"  # a bytes value in META_EXTRA is {"base64": "..."}


class CheckpointError(ValueError):
    """A checkpoint file or state dict does not fit; the message names the file or keys."""


# --------------------------------------------------------------------------- registry


class ModelKind(NamedTuple):
    model_cls: type  # built as model_cls(config)
    config_cls: type  # a dataclass; model.config is one
    from_dict: Callable[[dict], Any]  # dict (as saved) -> validated config


MODEL_KINDS: dict[str, ModelKind] = {}


def register_model_kind(
    name: str, model_cls: type, config_cls: type, from_dict: Callable[[dict], Any] | None = None
) -> None:
    """Make ``model_cls`` saveable / loadable under ``name``.

    ``model_cls(config)`` must build the model and keep the config as ``model.config``;
    ``from_dict`` turns the saved dict back into a validated config (default:
    ``config_cls.from_dict``). A name is bound to one class for the whole process.
    """
    known = MODEL_KINDS.get(name)
    if known is not None and known.model_cls is not model_cls:
        raise ValueError(f"model kind {name!r} is already registered for {known.model_cls.__qualname__}")
    if from_dict is None:
        if not hasattr(config_cls, "from_dict"):
            raise ValueError(f"register_model_kind({name!r}): {config_cls.__qualname__} has no from_dict; pass one")
        from_dict = config_cls.from_dict
    MODEL_KINDS[name] = ModelKind(model_cls, config_cls, from_dict)


register_model_kind("Backbone", Backbone, BackboneConfig, BackboneConfig.from_dict)

_OWN_PACKAGES = ("foundation.", "foundation_tasks.")  # a file may only name modules of this project for import


def _import_kind(kind_name: str, metadata: Mapping[str, str]) -> None:
    """Import the module that registers ``kind_name`` (named by the file), found by name as
    the engine finds tasks, so that this module imports none of them."""
    module = metadata.get(META_MODULE)
    if module and module.startswith(_OWN_PACKAGES):
        importlib.import_module(module)


def _kind_of(model: nn.Module) -> str:
    for name, kind in MODEL_KINDS.items():
        if type(model) is kind.model_cls:  # exact: a subclass is not silently saved as its base
            if not isinstance(getattr(model, "config", None), kind.config_cls):
                raise CheckpointError(
                    f"{type(model).__name__}.config should be a {kind.config_cls.__name__}, "
                    f"got {type(getattr(model, 'config', None)).__name__}"
                )
            return name
    raise CheckpointError(
        f"{type(model).__qualname__} is not a registered model kind ({', '.join(MODEL_KINDS)}); "
        "register it with foundation.checkpoint.register_model_kind"
    )


# --------------------------------------------------------------------------- save / load


def save(model: nn.Module, path: str | Path) -> Path:
    """Write ``model``'s weights and config to ``path`` (safetensors), atomically, with
    what ``model.export_meta()`` returns, when it has one (see the module docstring)."""
    kind = _kind_of(model)
    metadata = {
        META_FORMAT: FORMAT_VERSION,
        META_KIND: kind,
        META_CONFIG: json.dumps(to_dict(model.config), sort_keys=True),
        META_MODULE: type(model).__module__,
    }
    extra = model.export_meta() if hasattr(model, "export_meta") else getattr(model, "saved_meta", None)
    if extra:
        metadata[META_EXTRA] = _encode_meta(extra)
    tensors = _unshared(model.state_dict())
    path = Path(path)
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))
    return path


def _unshared(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU, contiguous tensors with no storage in common: safetensors refuses shared
    storage (tied weights appear under every name that holds them; each name gets its
    own copy, and loading copies the same values into the one shared parameter)."""
    out = {k: t.detach().cpu() for k, t in state.items()}
    users: dict[int, int] = {}
    for t in out.values():
        if t.numel():
            ptr = t.untyped_storage().data_ptr()
            users[ptr] = users.get(ptr, 0) + 1
    for k, t in out.items():
        shared = t.numel() and users[t.untyped_storage().data_ptr()] > 1
        if shared or not t.is_contiguous():
            out[k] = t.clone(memory_format=torch.contiguous_format)
    return out


def _open(path: Path) -> tuple[dict[str, str], dict[str, tuple[int, ...]], Callable[[], dict[str, torch.Tensor]]]:
    """(metadata, tensor shapes, read-all-tensors) of a safetensors file, the first two from
    its header alone; errors name the file."""
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None

    def tensors() -> dict[str, torch.Tensor]:
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                return {k: f.get_tensor(k) for k in f.keys()}
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{path}: could not read the tensors ({e})") from None

    return metadata, shapes, tensors


def _encode_meta(extra: Mapping[str, Any]) -> str:
    def encode(value: Any) -> Any:
        if isinstance(value, (bytes, bytearray)):
            return {_BYTES: base64.b64encode(bytes(value)).decode("ascii")}
        raise TypeError(f"export_meta: {type(value).__name__} is not JSON or bytes")

    return json.dumps(extra, sort_keys=True, default=encode)


def _decode_meta(path: Path, text: str) -> dict[str, Any]:
    def decode(obj: dict) -> Any:
        return base64.b64decode(obj[_BYTES]) if set(obj) == {_BYTES} else obj

    try:
        meta = json.loads(text, object_hook=decode)
    except (json.JSONDecodeError, ValueError) as e:
        raise CheckpointError(f"{path}: the {META_EXTRA!r} metadata is not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: the {META_EXTRA!r} metadata is not a JSON object")
    return meta


def read_meta(path: str | Path) -> dict[str, Any]:
    """``{section: {key: value}}`` that the model's ``export_meta()`` wrote into the file
    (bytes values come back as bytes); {} for a file without it."""
    path = Path(path)
    metadata, _, _ = _open(path)
    return _decode_meta(path, metadata[META_EXTRA]) if META_EXTRA in metadata else {}


def read_config(path: str | Path) -> tuple[str, Any]:
    """(model kind, validated config) stored in a checkpoint, without reading weights; the
    config is checked against the file's tensor shapes (``_check_fits``)."""
    path = Path(path)
    metadata, shapes, _ = _open(path)
    kind_name, config = _config_from_metadata(path, metadata)
    _check_fits(path, kind_name, config, shapes)
    return kind_name, config


def _config_from_metadata(path: Path, metadata: Mapping[str, str]) -> tuple[str, Any]:
    if META_KIND not in metadata or META_CONFIG not in metadata:
        raise CheckpointError(
            f"{path}: no model config in the file's metadata (keys {META_KIND!r} and {META_CONFIG!r}); "
            "it was not written by foundation.checkpoint.save - load its weights with load_state_into"
        )
    if metadata.get(META_FORMAT, FORMAT_VERSION) != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format {metadata[META_FORMAT]!r}, this code reads {FORMAT_VERSION!r}"
        )
    kind_name = metadata[META_KIND]
    if kind_name not in MODEL_KINDS:
        _import_kind(kind_name, metadata)
    if kind_name not in MODEL_KINDS:
        raise CheckpointError(
            f"{path}: unknown model kind {kind_name!r}; registered: {', '.join(MODEL_KINDS)} "
            "(import the module that registers it)"
        )
    try:
        data = json.loads(metadata[META_CONFIG])
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: the config in the metadata is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: the config in the metadata is not a JSON object")
    try:
        config = MODEL_KINDS[kind_name].from_dict(data)
    except (ValueError, TypeError) as e:  # ConfigError is a ValueError
        raise CheckpointError(f"{path}: invalid {kind_name} config: {e}") from None
    return kind_name, config


# elements of buffers that a model builds but never saves (index tables) which a file's
# config may ask for beyond what the file holds
_MAX_UNSAVED = 2 ** 24


def _check_fits(path: Path, kind_name: str, config: Any, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """One ``CheckpointError`` line unless ``config`` builds exactly the file's tensors, found
    before anything is allocated: a forged config (``dim: 32768`` over a 0.7 MB file) would
    otherwise ask for gigabytes before its weights were found not to fit. The model is built
    on the meta device (shapes, no memory); the header's shapes are bounded by the file's
    size, so a model that passes holds no more than its file (and ``_MAX_UNSAVED``)."""
    backbone = _backbone_config(config)
    layers = backbone.depth + (backbone.decoder_depth or 0) if backbone is not None else 0
    if layers > len(shapes):  # every layer has weights: refused before building a module per layer
        raise CheckpointError(f"{path}: its config asks for {layers} backbone layers, but the file holds "
                              f"{len(shapes)} tensors in all")
    with torch.device("meta"), torch.random.fork_rng(devices=[]):  # the caller's RNG as if never built
        model = MODEL_KINDS[kind_name].model_cls(config)
    own = {k: tuple(t.shape) for k, t in model.state_dict().items()}
    wrong = [f"{k}: the config builds {own[k]}, the file holds {shapes[k]}" for k in own
             if k in shapes and own[k] != shapes[k]]
    wrong += [f"{k}: the config builds {own[k]}, the file has no such tensor" for k in own if k not in shapes]
    wrong += [f"{k}: in the file {shapes[k]}, the config builds no such tensor" for k in shapes if k not in own]
    if wrong:
        more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise CheckpointError(f"{path}: the {kind_name} config in its metadata does not fit its tensors: "
                              f"{wrong[0]}{more}")
    unsaved = sum(b.numel() for name, b in model.named_buffers() if name not in own)
    if unsaved > _MAX_UNSAVED + sum(math.prod(s) for s in shapes.values()):
        raise CheckpointError(f"{path}: its {kind_name} config builds {unsaved} buffer elements it never saves, "
                              "more than the whole file holds")


def load(path: str | Path, device: str | torch.device | None = None) -> nn.Module:
    """Build the model a checkpoint describes and load its weights (strictly); the config is
    checked against the file's tensor shapes first (``_check_fits``)."""
    path = Path(path)
    metadata, shapes, tensors = _open(path)
    kind_name, config = _config_from_metadata(path, metadata)
    _check_fits(path, kind_name, config, shapes)
    model = MODEL_KINDS[kind_name].model_cls(config)
    load_state_into(model, tensors(), where=str(path))
    model.saved_meta = _decode_meta(path, metadata[META_EXTRA]) if META_EXTRA in metadata else {}
    return model.to(device) if device is not None else model


def sub_state(state: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors under ``prefix`` (e.g. ``"heads.classification."``) with the prefix removed:
    one module's weights out of a whole model's file."""
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def load_state_into(
    model: nn.Module, source: str | Path | Mapping[str, torch.Tensor], *, where: str | None = None
) -> nn.Module:
    """Strictly load a checkpoint file or state dict into ``model``.

    Every key and shape is checked before anything is copied: on a mismatch the model is
    left unchanged and the error lists the missing, unexpected and mis-shaped keys.
    """
    if isinstance(source, (str, Path)):
        where = where or str(source)
        metadata, _, tensors = _open(Path(source))
        saved_config = _config_from_metadata(Path(source), metadata)[1] if META_CONFIG in metadata else None
        state = tensors()
    else:
        where = where or "state dict"
        state, saved_config = source, None
    own = model.state_dict()
    not_tensors = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in state and k not in not_tensors and state[k].shape != own[k].shape
    ]
    problems = [
        (f"{len(missing)} missing key(s)", missing),
        (f"{len(unexpected)} unexpected key(s)", unexpected),
        (f"{len(shapes)} shape mismatch(es)", shapes),
        (f"{len(not_tensors)} value(s) that are not tensors", not_tensors),
    ]
    if any(items for _, items in problems):
        lines = [f"{where} does not fit {type(model).__name__}:"]
        for title, items in problems:
            if items:
                lines.append(f"  {title}: " + _listing(items))
        raise CheckpointError("\n".join(lines))
    if saved_config is not None:
        _check_same_computation(model, saved_config, where)
    model.load_state_dict(state, strict=True)
    return model


# Fields that change what the weights compute without changing any key or shape: a
# Pre-LN checkpoint has exactly the keys of a Post-LN model, so keys alone cannot tell.
_COMPUTATION_FIELDS = ("norm", "arch", "residual_scale", "activation")


def _backbone_config(cfg: Any) -> BackboneConfig | None:
    if isinstance(cfg, BackboneConfig):
        return cfg
    inner = getattr(cfg, "backbone", None)
    return inner if isinstance(inner, BackboneConfig) else None


def _check_same_computation(model: nn.Module, saved: Any, where: str) -> None:
    ours, theirs = _backbone_config(getattr(model, "config", None)), _backbone_config(saved)
    if ours is None or theirs is None:
        return
    diff = [f"{f}: checkpoint {getattr(theirs, f)!r} vs model {getattr(ours, f)!r}"
            for f in _COMPUTATION_FIELDS if getattr(theirs, f) != getattr(ours, f)]
    if diff:
        raise CheckpointError(f"{where} was trained with a different backbone rule: " + "; ".join(diff))


def _listing(items: Sequence[str], limit: int = 20) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... and {len(items) - limit} more" if len(items) > limit else "")
