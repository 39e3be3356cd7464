"""torchscale 0.3.0 (the official Magneto / DeepNet / BEiT-3 code) <-> our ``Backbone``.

One table maps the configs (``_FIELDS``) and one maps the state-dict keys
(``_torchscale_pairs``); ``from_torchscale`` and ``to_torchscale`` both read them.
``import_torchscale`` imports torchscale next to our stack.
"""
from __future__ import annotations

import math
import sys
import types
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from foundation.checkpoint.format import CheckpointError, _listing, load_state_into
from foundation.config import BackboneConfig
from foundation.scaling import RULES, stack_rules
from foundation.transformer import Backbone

# Modules around torchscale's Transformer stack that our Backbone does not hold; a caller
# that converts them into its own front end / head may name them in ``ignore``.
TORCHSCALE_OUTSIDE = ("embed_tokens", "embed_positions", "layernorm_embedding", "output_projection")

# (our BackboneConfig field, torchscale EncoderConfig option) that carry the same value
_FIELDS = (
    ("dim", "encoder_embed_dim"),
    ("heads", "encoder_attention_heads"),
    ("ffn_dim", "encoder_ffn_embed_dim"),
    ("depth", "encoder_layers"),
    ("activation", "activation_fn"),
    ("layernorm_eps", "layernorm_eps"),
    ("dropout", "dropout"),
    ("attn_dropout", "attention_dropout"),
    ("activation_dropout", "activation_dropout"),
    ("drop_path", "drop_path_rate"),
)

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
    sub_ln = cfg.rule.sub_ln
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
    if cfg.has_final_norm:
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
    ours = stack_rules(norm, "encoder", n)["encoder"].alpha
    # torchscale's encoder of an encoder-decoder uses 0.81 (N^4 M)^(1/16) instead
    residual_scale = None if math.isclose(alpha, ours, rel_tol=1e-12) else float(alpha)
    if residual_scale is not None and RULES[norm].pre_norm:
        raise ValueError(f"torchscale EncoderLayer.alpha={alpha}: a residual weight needs post-norm residuals")

    return BackboneConfig(
        **{ours: getattr(args, theirs) for ours, theirs in _FIELDS},
        norm=norm,
        experts=list(experts) if args.multiway else [],
        rel_pos="1d" if rel_1d else "none",
        rel_pos_buckets=args.rel_pos_buckets if rel_1d else 32,
        rel_pos_max_distance=args.max_rel_pos if rel_1d else 128,
        final_norm=bool(args.normalize_output) if RULES[norm].pre_norm else None,
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


def torchscale_norm_flags(norm: str) -> dict[str, bool]:
    """torchscale's three flags for one of our rules (its post-processing reads them together:
    deepnorm and subln each override normalize_before), from the rule's own description."""
    rule = RULES[norm]
    return dict(encoder_normalize_before=rule.pre_norm, subln=rule.sub_ln, deepnorm=norm == "deepnorm")


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
    torchscale_alpha = stack_rules(cfg.norm, "encoder", cfg.depth)["encoder"].alpha
    if cfg.residual_scale is not None and not math.isclose(cfg.residual_scale, torchscale_alpha, rel_tol=1e-12):
        raise ValueError(
            f"residual_scale={cfg.residual_scale!r}: torchscale's encoder-only Encoder uses {torchscale_alpha}"
        )
    return dict(
        **{theirs: getattr(cfg, ours) for ours, theirs in _FIELDS},
        **torchscale_norm_flags(cfg.norm),
        normalize_output=cfg.has_final_norm,  # read by torchscale for pre-norm only, as ours
        multiway=bool(cfg.experts),
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


# --------------------------------------------------------------------------- importing torchscale
# torchscale pins timm 0.6 and fairscale 0.4, which conflict with ours, so it is installed
# with ``pip install --no-deps torchscale==0.3.0``. At import it needs only fairscale's
# ``checkpoint_wrapper`` and ``wrap`` (used when activation checkpointing or FSDP is asked
# for); when fairscale is absent we register stand-ins that refuse to be used.


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
