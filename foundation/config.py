"""Typed, validated configs: dataclasses in, YAML on disk, errors that name the field.

Type checking and unknown-key detection come from OmegaConf's structured configs; the
semantic checks (a norm that exists, heads that divide dim, ...) live in __post_init__.
"""
from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional, Sequence, Type, TypeVar

import yaml
import omegaconf
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf._utils import get_omega_conf_dumper  # OmegaConf.to_yaml's own dumper, without its node wrapping
from omegaconf.errors import OmegaConfBaseException

from foundation.scaling import ARCHS, NORMS, RULES, NormRule

T = TypeVar("T")


class ConfigError(ValueError):
    """A config field is unknown, mistyped or out of range; the message names it."""


def _by_norm(values: Any, *, _root_: DictConfig) -> Any:
    """``${by_norm:{magneto: 5.0e-3, preln: 3.0e-3}}``: the value for the config's own
    ``backbone.norm``, so one config carries a recipe whose settings differ per norm (the
    papers tune the peak lr per norm) and ``backbone.norm=preln`` switches all of them."""
    norm = OmegaConf.select(_root_, "backbone.norm", default="magneto")
    if norm not in values:
        raise ConfigError(f"by_norm gives no value for backbone.norm={norm!r} (it has: {', '.join(values)})")
    return values[norm]


if not OmegaConf.has_resolver("by_norm"):
    # omegaconf 2.4 renamed register_new_resolver, which now warns on every import; in 2.3 register_resolver
    # is the deprecated 2.0 API, with other semantics
    register = (OmegaConf.register_resolver if tuple(int(p) for p in omegaconf.__version__.split(".")[:2]) >= (2, 4)
                else OmegaConf.register_new_resolver)
    register("by_norm", _by_norm)


def build(cls: Type[T], *sources: Any, where: str = "config") -> T:
    """Build dataclass ``cls`` from dicts / OmegaConf nodes / dotted ``key=value`` lists,
    later sources overriding earlier ones. ``where`` (e.g. a file name) prefixes errors."""
    try:
        merged = OmegaConf.structured(cls)
        for src in sources:
            if isinstance(src, (list, tuple)):
                src = OmegaConf.from_dotlist(list(src))
            merged = OmegaConf.merge(merged, src)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        msg = str(e).splitlines()[0]
        raise ConfigError(f"{where}: field {key!r}: {msg}" if key else f"{where}: {msg}") from None
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def read_mapping(path: str | Path) -> DictConfig:
    """A YAML file whose top level is a mapping (an empty file is an empty one);
    ConfigError naming the file otherwise. (OmegaConf alone reads a file holding the bare
    string ``hello`` as ``{hello: None}``, which then fails as an unknown field.)"""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        top = yaml.safe_load(path.read_text())
        if top is not None and not isinstance(top, dict):
            kind = {str: "a bare string", list: "a list", bool: "a boolean", int: "a number", float: "a number"}.get(
                type(top), f"a {type(top).__name__}")
            raise ConfigError(f"{path}: the file holds {kind} ({str(top)[:40]!r}); a config is a mapping of "
                              "sections (backbone:, tasks:, train: ...)")
        data = OmegaConf.load(path)
    except ConfigError:
        raise
    except Exception as e:  # yaml syntax errors, undecodable bytes
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    return data if isinstance(data, DictConfig) else OmegaConf.create({})


def read_yaml(path: str | Path, overrides: Sequence[str] = ()) -> DictConfig:
    """The one YAML reader: a mapping file (``read_mapping``) with command-line style
    overrides applied (``apply_override``), not yet validated."""
    raw = read_mapping(path)
    for item in overrides:
        apply_override(raw, item)
    return raw


def load_yaml(cls: Type[T], path: str | Path, overrides: Sequence[str] | None = None) -> T:
    return build(cls, read_yaml(path, overrides or ()), where=str(path))


def apply_override(raw: DictConfig, item: str, where: str = "command line") -> None:
    """``key=value`` onto the raw YAML tree; the value is parsed as YAML (numbers, null, lists),
    but a boolean keeps its text, which the field's type converts (``run_name=off`` is "off").
    ``~key`` deletes the key (or the task entry ``~tasks.<id>``), as Hydra's delete override.
    An entry of a top-level list of named mappings is addressed by its index or its ``id`` /
    ``name`` (``tasks.0.problem=sort`` or ``tasks.seq2seq.problem=sort``)."""
    key, eq, value = item.partition("=")
    key = key.strip().lstrip("-")
    delete = key.startswith("~")
    key = key.lstrip("~")
    if not key or (eq if delete else not eq):
        raise ConfigError(f"{where}: override {item!r} is not key=value or ~key")
    parts = key.split(".")
    entries = raw.get(parts[0]) if len(parts) > 1 and not parts[1].isdigit() else None
    if OmegaConf.is_list(entries) and all(isinstance(t, DictConfig) for t in entries):
        ids = [str(t.get("id") or t.get("name")) for t in entries]
        if parts[1] not in ids:
            raise ConfigError(f"{where}: override {item!r}: no {parts[0].rstrip('s')} {parts[1]!r} in the config "
                              f"({parts[0]}: {', '.join(ids)})")
        parts[1] = str(ids.index(parts[1]))
    if delete:
        _delete(raw, parts, item, where)
        return
    try:
        parsed = OmegaConf.from_dotlist([f"value={value}"])["value"]
        if isinstance(parsed, bool):
            # YAML 1.1 reads off / yes / on / true as booleans: the text is kept, so that a
            # string field (run_name=off) gets it as written and a bool field converts it
            parsed = value.strip()
        OmegaConf.update(raw, ".".join(parts), parsed, merge=True)
    except OmegaConfBaseException as e:
        raise ConfigError(f"{where}: override {item!r}: {str(e).splitlines()[0]}") from None


def _delete(raw: DictConfig, parts: list[str], item: str, where: str) -> None:
    node: Any = raw
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, DictConfig) and part in node:
            if last:
                del node[part]
                return
            node = node[part]
        elif OmegaConf.is_list(node) and part.isdigit() and int(part) < len(node):
            if last:
                del node[int(part)]
                return
            node = node[int(part)]
        else:
            break
    raise ConfigError(f"{where}: override {item!r}: the config has no {'.'.join(parts[:i + 1])!r} to delete")




def to_dict(cfg: Any) -> dict:
    """A config (dataclass instance, OmegaConf node or mapping) as plain dicts and lists.

    A built dataclass is walked directly rather than through ``OmegaConf.structured``, which
    wraps every list element in a node: a VQA v2 answer vocabulary (thousands of strings)
    would cost seconds each time a run's config is compared, entered or written."""
    if isinstance(cfg, (DictConfig, ListConfig)):
        return OmegaConf.to_container(cfg, resolve=True)
    return _plain(cfg)


def _plain(value: Any, annotation: Any = None) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        hints = _hints(type(value))
        return {f.name: _plain(getattr(value, f.name), hints.get(f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and annotation in (float, Optional[float]):
        return float(value)  # what OmegaConf's float node holds, so that saved configs compare equal
    return value


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict:
    return typing.get_type_hints(cls)


def yaml_text(data: Mapping) -> str:
    """``data`` (plain containers) as OmegaConf writes YAML: its dumper quotes the strings its
    loader would otherwise read as numbers or booleans."""
    return yaml.dump(dict(data), default_flow_style=False, allow_unicode=True, sort_keys=False,
                     Dumper=get_omega_conf_dumper())


def save_yaml(cfg: Any, path: str | Path) -> None:
    Path(path).write_text(yaml_text(to_dict(cfg)))


@dataclass
class BackboneConfig:
    """The shared Transformer backbone. ``norm`` picks the residual/normalisation rule
    (each described once in ``foundation.scaling.RULES``):

    preln     x + f(LN(x))                               (ViT, GPT)
    postln    LN(a x + f(x)), a = residual_scale or 1    (BERT; FoundationLayerNorm: a=0.974)
    magneto   x + f(LN(x)), f with Sub-LN inside, W_v/W_o/W_1/W_2 init times gamma
    deepnorm  LN(alpha x + f(x)), W_v/W_o/W_1/W_2 init times beta (DeepNet)
    """

    dim: int = 768
    depth: int = 12  # encoder layers (N); decoder layers for arch="decoder"
    heads: int = 12
    ffn_dim: Optional[int] = None  # default 4 * dim
    norm: str = "magneto"
    arch: str = "encoder"  # encoder | decoder (causal) | encoder_decoder
    decoder_depth: Optional[int] = None  # M for encoder_decoder; default = depth
    # multiway: one copy of every per-modality module per expert, e.g. ["vision", "text"]
    experts: List[str] = field(default_factory=list)
    vl_expert_layers: int = 0  # top-K layers get a shared "vl" FFN expert for mixed input (BEiT-3)
    # multiway only: one self-attention (and its LayerNorms) for every expert, experts in the
    # FFN sub-layer alone (VLMo's MoME); false = BEiT-3 / torchscale (attention projections per expert)
    shared_attention: bool = False
    activation: str = "gelu"  # exact (erf) GELU
    layernorm_eps: float = 1e-5
    qkv_bias: bool = True
    dropout: float = 0.0
    attn_dropout: float = 0.0
    activation_dropout: float = 0.0
    drop_path: float = 0.0  # stochastic depth, rising linearly from 0 to this over the layers
    layer_scale: Optional[float] = None  # initial value of per-channel residual scales (CaiT/BEiT)
    rel_pos: str = "none"  # none | 1d (bucketed, torchscale/T5) | 2d (BEiT patch grid)
    rel_pos_buckets: int = 32
    rel_pos_max_distance: int = 128
    rel_pos_grid: Optional[List[int]] = None  # (rows, cols) of patches for rel_pos="2d"
    rel_pos_prefix: int = 1  # tokens before the patch grid (class token) for rel_pos="2d"
    # LN after the last layer: null = the rule's own (preln / magneto: yes; postln / deepnorm: no,
    # each of their layers already ends in one, so final_norm=true is refused there)
    final_norm: Optional[bool] = None
    residual_scale: Optional[float] = None  # override alpha of postln / deepnorm (FoundationLayerNorm: 0.974)
    init_gain: Optional[float] = None  # override gamma / beta (Upscale-LN: 1.0)
    init_variant: str = "paper"  # paper | torchscale (bias scaling, 1/1.15 enc-dec encoder beta)
    checkpoint_activations: bool = False

    def __post_init__(self) -> None:
        def bad(name: str, msg: str) -> ConfigError:
            return ConfigError(f"field {name!r}: {msg} (got {getattr(self, name)!r})")

        if self.norm not in NORMS:
            raise bad("norm", f"must be one of {', '.join(NORMS)}")
        if self.arch not in ARCHS:
            raise bad("arch", f"must be one of {', '.join(ARCHS)}")
        for name in ("dim", "depth", "heads"):
            if getattr(self, name) < 1:
                raise bad(name, "must be >= 1")
        if self.dim % self.heads:
            raise bad("heads", f"must divide dim={self.dim}")
        if self.ffn_dim is None:
            self.ffn_dim = 4 * self.dim
        if self.ffn_dim < 1:
            raise bad("ffn_dim", "must be >= 1")
        if self.decoder_depth is not None and self.arch != "encoder_decoder":
            raise bad("decoder_depth", "is only used with arch='encoder_decoder'")
        if self.arch == "encoder_decoder" and self.decoder_depth is None:
            self.decoder_depth = self.depth
        if len(set(self.experts)) != len(self.experts) or "vl" in self.experts:
            raise bad("experts", "names must be unique and 'vl' is reserved for the shared expert")
        if self.experts and self.arch != "encoder":
            raise bad("experts", "multiway experts are supported for arch='encoder'")
        if not 0 <= self.vl_expert_layers <= self.depth or (self.vl_expert_layers and len(self.experts) < 2):
            raise bad("vl_expert_layers", "must be within [0, depth] and needs at least two experts")
        if self.activation not in ("gelu", "relu", "swish"):
            raise bad("activation", "must be gelu, relu or swish")
        for name in ("dropout", "attn_dropout", "activation_dropout", "drop_path"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise bad(name, "must be in [0, 1)")
        if self.rel_pos not in ("none", "1d", "2d"):
            raise bad("rel_pos", "must be none, 1d or 2d")
        if self.rel_pos == "2d" and (self.rel_pos_grid is None or len(self.rel_pos_grid) != 2):
            raise bad("rel_pos_grid", "rel_pos='2d' needs the patch grid as [rows, cols]")
        if self.rel_pos_grid is not None and self.rel_pos != "2d":
            raise bad("rel_pos_grid", f"is only used with rel_pos='2d' (rel_pos is {self.rel_pos!r}); remove it")
        if self.init_variant not in ("paper", "torchscale"):
            raise bad("init_variant", "must be paper or torchscale")
        if self.shared_attention and not self.experts:
            raise bad("shared_attention", "shares self-attention among multiway experts; this backbone has no experts")
        rule = self.rule
        if self.final_norm and not rule.pre_norm:
            raise bad("final_norm", f"{self.norm} ends every layer in a LayerNorm, so a final one would be ignored; "
                      "final_norm=true applies to preln / magneto only (leave it null or false)")
        if self.residual_scale is not None and rule.pre_norm:
            raise bad("residual_scale", f"is the shortcut weight of post-norm rules (postln, deepnorm); "
                      f"{self.norm} has none")

    @property
    def has_final_norm(self) -> bool:
        """Whether the stack ends in a LayerNorm after its last layer."""
        return self.rule.final_norm and self.final_norm is not False

    @property
    def rule(self) -> NormRule:
        """The description of ``norm`` (``foundation.scaling.RULES``)."""
        return RULES[self.norm]

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: list[str] | None = None) -> "BackboneConfig":
        return load_yaml(cls, path, overrides)

    @classmethod
    def from_dict(cls, data: dict, where: str = "backbone config") -> "BackboneConfig":
        """A saved backbone config (a model file's, a run's)."""
        return build(cls, data, where=where)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "BackboneConfig":
        """A named preset (see PRESETS), with field overrides."""
        if name not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}; known: {', '.join(sorted(PRESETS))}")
        return build(cls, {**PRESETS[name], **overrides}, where=f"preset {name!r}")

    def to_yaml(self, path: str | Path) -> None:
        save_yaml(self, path)

    def to_dict(self) -> dict:
        return to_dict(self)

    def replace(self, **changes: Any) -> "BackboneConfig":
        return build(BackboneConfig, {**self.to_dict(), **changes}, where="backbone config")


# Sizes follow the ViT tables (tiny/small/base/large); the two normalisation presets
# come from papers/foundation-layernorm.txt.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(dim=192, depth=12, heads=3),
    "small": dict(dim=384, depth=12, heads=6),
    "base": dict(dim=768, depth=12, heads=12),
    "large": dict(dim=1024, depth=24, heads=16),
    # FoundationLayerNorm: Post-LN with a constant residual weight of 0.974.
    "foundation_ln": dict(norm="postln", residual_scale=0.974),
    # Upscale-LN: DeepNorm's alpha on the shortcut, no beta on the init.
    "upscale_ln": dict(norm="deepnorm", init_gain=1.0),
}

