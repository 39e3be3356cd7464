"""Checkpoints: safetensors weights plus the config that built them, and converters.

A checkpoint is one ``.safetensors`` file. Its metadata holds the model kind (a name in
``MODEL_KINDS``) and the model's config as JSON, so ``load(path)`` rebuilds the model
from the file alone. Kinds are an explicit registry: a file names a kind, never a class
path, and nothing is ever unpickled. The file also names the module whose import
registers its kind (``foundation.module``); ``load`` imports it when the kind is not yet
registered, but only a module of this project's own packages (``foundation``, ``tasks``),
so a run's ``MultiTaskModel``, a ``VisionTransformer`` or a ``BEiT3`` loads with no import
first, and this module depends on none of them.

What *using* the model needs beyond its weights (class names, image statistics, a
tokenizer, ...) travels in the same file: a model with an ``export_meta()`` method
returns ``{section: {key: value}}`` (JSON values, or ``bytes`` such as a sentencepiece
model), written as JSON into the metadata (``foundation.meta``; bytes base64-encoded).
``read_meta(path)`` gives it back, and ``load`` keeps it on the model as ``saved_meta``
(a model rebuilt from a file writes the same metadata again when it is saved).

Converters map the public checkpoints' layouts onto ours:

* ``from_torchscale`` / ``to_torchscale``: torchscale 0.3.0's ``Encoder`` (the official
  Magneto / DeepNet / BEiT-3 code) <-> our ``Backbone``.
(``foundation.vit.from_timm`` converts a timm ``VisionTransformer``.)
"""
from __future__ import annotations

import base64
import importlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from foundation.config import BackboneConfig, to_dict
from foundation.scaling import deepnorm_alpha
from foundation.transformer import Backbone

FORMAT_VERSION = "1"
_UMASK = os.umask(0o022)
os.umask(_UMASK)
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

# Where the project's own kinds register, for files written before META_MODULE existed.
_KIND_MODULES = {"VisionTransformer": "foundation.vit", "MultiTaskModel": "foundation.engine.model",
                 "BEiT3": "tasks.vl_common.beit3"}
_OWN_PACKAGES = ("foundation.", "tasks.")  # a file may only name modules of this project for import


def _import_kind(kind_name: str, metadata: Mapping[str, str]) -> None:
    """Import the module that registers ``kind_name`` (named by the file, or by the table
    above), found by name as the engine finds tasks, so that this module imports none of them."""
    module = metadata.get(META_MODULE) or _KIND_MODULES.get(kind_name)
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


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """``write`` a temporary file next to ``path``, fsync it, then rename it over ``path``:
    readers see the old file or the whole new one, never a partial one."""
    path = Path(path)
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        write(tmp)
        fsync_path(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp's 0600 would outlive the rename
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_path(directory)  # make the rename itself durable


def fsync_path(path: str | Path) -> None:
    """fsync a file or directory; a no-op where the platform refuses."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _open(path: Path) -> tuple[dict[str, str], Callable[[], dict[str, torch.Tensor]]]:
    """(metadata, read-all-tensors) of a safetensors file; errors name the file."""
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None

    def tensors() -> dict[str, torch.Tensor]:
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                return {k: f.get_tensor(k) for k in f.keys()}
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{path}: could not read the tensors ({e})") from None

    return metadata, tensors


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
    metadata, _ = _open(path)
    return _decode_meta(path, metadata[META_EXTRA]) if META_EXTRA in metadata else {}


def read_config(path: str | Path) -> tuple[str, Any]:
    """(model kind, validated config) stored in a checkpoint, without reading weights."""
    path = Path(path)
    metadata, _ = _open(path)
    return _config_from_metadata(path, metadata)


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


def load(path: str | Path, device: str | torch.device | None = None) -> nn.Module:
    """Build the model a checkpoint describes and load its weights (strictly)."""
    path = Path(path)
    metadata, tensors = _open(path)
    kind_name, config = _config_from_metadata(path, metadata)
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
        metadata, tensors = _open(Path(source))
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


# --------------------------------------------------------------------------- torchscale

# Modules around torchscale's Transformer stack that our Backbone does not hold; a caller
# that converts them into its own front end / head may name them in ``ignore``.
TORCHSCALE_OUTSIDE = ("embed_tokens", "embed_positions", "layernorm_embedding", "output_projection")

# (ours, our sub-path, torchscale's, torchscale's sub-path, Sub-LN only) per layer; with
# multiway the expert goes between the module and its sub-path (mlp.text.fc1 / ffn.B.fc1).
_LAYER_MODULES = (
    ("norm1", "", "self_attn_layer_norm", "", False),
    ("attn.norm", "", "self_attn.inner_attn_ln", "", True),
    ("attn.proj", "", "self_attn.out_proj", "", False),
    ("norm2", "", "final_layer_norm", "", False),
    ("mlp", "fc1", "ffn", "fc1", False),
    ("mlp", "norm", "ffn", "ffn_layernorm", True),
    ("mlp", "fc2", "ffn", "fc2", False),
)
_TS_REL_POS = "relative_position.relative_attention_bias.weight"


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _torchscale_pairs(cfg: BackboneConfig) -> Iterator[tuple[str, list[str]]]:
    """(our key, [torchscale keys]) for every tensor; several torchscale keys (q, k, v)
    are stacked row-wise into our one fused ``qkv``."""
    experts = list(zip(cfg.experts, "AB")) or [("", "")]
    sub_ln = cfg.norm == "magneto"
    for i in range(cfg.depth):
        ours, theirs = f"encoder.layers.{i}", f"layers.{i}"
        for e, ab in experts:
            for p in ("weight", "bias"):
                yield (_join(ours, "attn.qkv", e, p),
                       [_join(theirs, f"self_attn.{x}_proj", ab, p) for x in "qkv"])
        for our_mod, our_sub, ts_mod, ts_sub, only_sub_ln in _LAYER_MODULES:
            if only_sub_ln and not sub_ln:
                continue
            for e, ab in experts:
                for p in ("weight", "bias"):
                    yield _join(ours, our_mod, e, our_sub, p), [_join(theirs, ts_mod, ab, ts_sub, p)]
    if cfg.pre_norm and cfg.final_norm:
        for e, ab in experts:
            for p in ("weight", "bias"):
                yield _join("encoder.norm", e, p), [_join("layer_norm", ab, p)]
    if cfg.rel_pos == "1d":
        yield "encoder.rel_pos.table", [_TS_REL_POS]


def torchscale_config(
    encoder: nn.Module, experts: Sequence[str] = ("vision", "text"), *, ignore: Sequence[str] = ()
) -> BackboneConfig:
    """Our ``BackboneConfig`` for a torchscale 0.3.0 ``Encoder``; ValueError naming the
    torchscale option for anything our Backbone cannot reproduce."""
    args = encoder.args
    bad_ignore = set(ignore) - set(TORCHSCALE_OUTSIDE)
    if bad_ignore:
        raise ValueError(
            f"ignore: {sorted(bad_ignore)} are not modules outside the stack ({', '.join(TORCHSCALE_OUTSIDE)})"
        )

    def refuse(option: str, why: str) -> ValueError:
        return ValueError(f"torchscale option {option}={getattr(args, option, None)!r}: {why}")

    if getattr(args, "moe_freq", 0) or getattr(args, "moe_expert_count", 0) or any(
        getattr(layer, "is_moe_layer", False) for layer in encoder.layers
    ):
        raise refuse("moe_freq", "mixture-of-experts layers are not supported")
    if getattr(args, "xpos_rel_pos", False):
        raise refuse("xpos_rel_pos", "xPos rotary positions are not supported")
    if getattr(encoder, "embed_scale", 1.0) != 1.0:
        raise refuse("no_scale_embedding", f"embedding scale {encoder.embed_scale} != 1 is not supported")
    for name in TORCHSCALE_OUTSIDE:
        if getattr(encoder, name, None) is not None and name not in ignore:
            option = {"layernorm_embedding": "layernorm_embedding", "output_projection": "no_output_layer"}.get(name)
            why = (f"the encoder has {name}, which our Backbone does not hold (it takes embeddings in and "
                   f"gives hidden states out); convert it separately and pass ignore=({name!r},)")
            raise refuse(option, why) if option else ValueError(f"torchscale Encoder.{name}: {why}")
    if args.activation_fn not in ("gelu", "relu", "swish"):
        raise refuse("activation_fn", "must be gelu, relu or swish")
    if args.subln and args.deepnorm:
        raise refuse("subln", "subln and deepnorm together is not a rule we implement")
    if args.subln:
        if not args.encoder_normalize_before:
            raise refuse("encoder_normalize_before", "Sub-LN with Post-LN residuals is not supported")
        norm = "magneto"
    elif args.deepnorm:
        norm = "deepnorm"
    else:
        norm = "preln" if args.encoder_normalize_before else "postln"
    if args.multiway and len(experts) != 2:
        raise ValueError(f"experts: a multiway torchscale encoder has two experts (A, B); got {list(experts)}")
    rel_1d = args.rel_pos_buckets > 0 and args.max_rel_pos > 0

    n = args.encoder_layers
    alpha = getattr(encoder.layers[0], "alpha", 1.0) if len(encoder.layers) else 1.0
    ours = deepnorm_alpha("encoder", n)[0] if norm == "deepnorm" else 1.0
    # torchscale's encoder of an encoder-decoder uses 0.81 (N^4 M)^(1/16) instead
    residual_scale = None if math.isclose(alpha, ours, rel_tol=1e-12) else float(alpha)
    if residual_scale is not None and norm not in ("deepnorm", "postln"):
        raise ValueError(f"torchscale EncoderLayer.alpha={alpha}: a residual weight needs post-norm residuals")

    return BackboneConfig(
        dim=args.encoder_embed_dim,
        depth=n,
        heads=args.encoder_attention_heads,
        ffn_dim=args.encoder_ffn_embed_dim,
        norm=norm,
        experts=list(experts) if args.multiway else [],
        activation=args.activation_fn,
        layernorm_eps=args.layernorm_eps,
        dropout=args.dropout,
        attn_dropout=args.attention_dropout,
        activation_dropout=args.activation_dropout,
        drop_path=args.drop_path_rate,
        rel_pos="1d" if rel_1d else "none",
        rel_pos_buckets=args.rel_pos_buckets if rel_1d else 32,
        rel_pos_max_distance=args.max_rel_pos if rel_1d else 128,
        final_norm=bool(args.normalize_output) if norm in ("preln", "magneto") else True,
        residual_scale=residual_scale,
        init_variant="torchscale",
        checkpoint_activations=bool(args.checkpoint_activations),
    )


def from_torchscale(
    encoder: nn.Module, experts: Sequence[str] = ("vision", "text"), *, ignore: Sequence[str] = ()
) -> Backbone:
    """Our ``Backbone`` computing what a torchscale 0.3.0 ``Encoder`` computes.

    Multiway: torchscale's A expert becomes ``experts[0]``, B ``experts[1]``; its
    ``multiway_split_position`` s is our ``segments=[(experts[0], s), (experts[1], T - s)]``
    (s = -1: all A; s = 0: all B). ``ignore`` names modules outside the stack
    (``TORCHSCALE_OUTSIDE``) that the caller converts itself.
    """
    cfg = torchscale_config(encoder, experts, ignore=ignore)
    state = {k: v for k, v in encoder.state_dict().items() if k.split(".")[0] not in ignore}
    ours: dict[str, torch.Tensor] = {}
    used, missing = set(), []
    for key, ts_keys in _torchscale_pairs(cfg):
        absent = [k for k in ts_keys if k not in state]
        if absent:
            missing += absent
            continue
        ours[key] = torch.cat([state[k] for k in ts_keys]) if len(ts_keys) > 1 else state[ts_keys[0]]
        used.update(ts_keys)
    unexpected = [k for k in state if k not in used]
    if missing or unexpected:
        raise CheckpointError(
            f"torchscale encoder does not match the inferred config ({cfg.norm}, {cfg.depth} layers): "
            f"missing {_listing(missing) or 'none'}; not converted {_listing(unexpected) or 'none'}"
        )
    model = Backbone(cfg)
    load_state_into(model, ours, where="converted torchscale encoder")
    return model.train(encoder.training)


def torchscale_args(cfg: BackboneConfig) -> dict[str, Any]:
    """``EncoderConfig(**torchscale_args(cfg))`` builds the torchscale 0.3.0 encoder that
    ``to_torchscale`` fills; ValueError naming the field for what torchscale cannot express."""
    if cfg.arch != "encoder":
        raise ValueError(f"arch={cfg.arch!r}: only encoder-only backbones convert to torchscale's Encoder")
    if cfg.experts and len(cfg.experts) != 2:
        raise ValueError(f"experts={cfg.experts!r}: torchscale's multiway has exactly two experts (A, B)")
    for name, ok in (
        ("vl_expert_layers", cfg.vl_expert_layers == 0),
        ("shared_attention", not (cfg.shared_attention and cfg.experts)),
        ("layer_scale", cfg.layer_scale is None),
        ("qkv_bias", cfg.qkv_bias),
        ("rel_pos", cfg.rel_pos in ("none", "1d")),
    ):
        if not ok:
            raise ValueError(f"{name}={getattr(cfg, name)!r} has no torchscale Encoder equivalent")
    torchscale_alpha = deepnorm_alpha("encoder", cfg.depth)[0] if cfg.norm == "deepnorm" else 1.0
    if cfg.residual_scale is not None and not math.isclose(cfg.residual_scale, torchscale_alpha, rel_tol=1e-12):
        raise ValueError(
            f"residual_scale={cfg.residual_scale!r}: torchscale's encoder-only Encoder uses {torchscale_alpha}"
        )
    return dict(
        encoder_embed_dim=cfg.dim,
        encoder_attention_heads=cfg.heads,
        encoder_ffn_embed_dim=cfg.ffn_dim,
        encoder_layers=cfg.depth,
        encoder_normalize_before=cfg.pre_norm,
        normalize_output=cfg.final_norm,
        subln=cfg.norm == "magneto",
        deepnorm=cfg.norm == "deepnorm",
        multiway=bool(cfg.experts),
        activation_fn=cfg.activation,
        layernorm_eps=cfg.layernorm_eps,
        dropout=cfg.dropout,
        attention_dropout=cfg.attn_dropout,
        activation_dropout=cfg.activation_dropout,
        drop_path_rate=cfg.drop_path,
        rel_pos_buckets=cfg.rel_pos_buckets if cfg.rel_pos == "1d" else 0,
        max_rel_pos=cfg.rel_pos_max_distance if cfg.rel_pos == "1d" else 0,
        vocab_size=-1,
        no_output_layer=True,
    )


def to_torchscale(backbone: Backbone) -> dict[str, torch.Tensor]:
    """torchscale 0.3.0 ``Encoder`` state dict of ``backbone`` (inverse of
    ``from_torchscale``); it loads with ``strict=True`` into
    ``Encoder(EncoderConfig(**torchscale_args(backbone.config)))``."""
    cfg = backbone.config
    torchscale_args(cfg)  # refuses what torchscale cannot express
    state = backbone.state_dict()
    out: dict[str, torch.Tensor] = {}
    for key, ts_keys in _torchscale_pairs(cfg):
        for ts_key, part in zip(ts_keys, state[key].chunk(len(ts_keys))):
            out[ts_key] = part.clone()
    return out
