"""Pretrained ViT weights into a segmentation model, resized to its resolution.

Segmentation fine-tunes at another resolution than pretraining (ADE20k: 640x640 crops
after 224x224 MIM pretraining), so the position embedding and the relative position table
change shape with the patch grid (resized by ``foundation_tasks.vision_common.resize``). The engine's
``init_from`` resizes them through ``Segmentation.adapt_init``; this module reads ViT files
for mmseg's ``MagnetoViT`` (its ``pretrained=`` / ``init_cfg``) and writes resized files.

Sources, recognised from their keys (and, for our files, the config in their metadata):

* a ``foundation.vit.VisionTransformer`` checkpoint (``patch_embed.*``, ``cls_token``,
  ``pos_embed``, ``backbone.*``), e.g. ``checkpoint.save(vit)`` or ``foundation.vit.from_timm``;
* an engine run's ``model.safetensors`` (``MultiTaskModel``: ``backbone.*`` plus
  ``heads.<task>.*``), e.g. a MIM pretraining run: the backbone, and the image front end
  (``patch_embed``, ``cls_token``, ``pos_embed``) of the one head that has a patch embedding;
* a ``Backbone`` checkpoint (backbone only).

Everything is returned in ``VisionTransformer`` names, which are those of ``MagnetoViT``
(mmseg) and, below ``backbone.``, of the engine's backbone; the engine head holds the
front end under the same names.
"""
from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import torch
from safetensors import SafetensorError, safe_open

from foundation.checkpoint import CheckpointError
from foundation.config import BackboneConfig, ConfigError
from foundation.embed import resize_pos_embed  # noqa: F401 (re-exported)
from foundation_tasks.vision_common.front_end import FRONT_END
from foundation_tasks.vision_common.resize import REL_POS_TABLE, resize_rel_pos_table  # noqa: F401 (re-exported)

# fields that change what the backbone's weights compute (see foundation.checkpoint)
_SAME_RULE = ("norm", "activation", "residual_scale", "arch")


@dataclass
class ViTWeights:
    """Pretrained tensors in ``VisionTransformer`` names, and what is known of their shapes."""

    tensors: dict[str, torch.Tensor]
    path: str
    backbone: BackboneConfig | None = None  # from the file's metadata, when it has one
    grid: tuple[int, int] | None = None  # the patch grid of pos_embed / the rel-pos table
    prefix_tokens: int = 1
    dropped: list[str] = field(default_factory=list)  # keys of the file not used (heads, ...)


def _is_front_end(name: str) -> bool:
    return name.startswith(FRONT_END[0]) or name in FRONT_END[1:]


def _metadata_config(path: Path) -> tuple[str | None, dict | None]:
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None
    kind, config = meta.get("foundation.kind"), meta.get("foundation.config")
    return kind, (json.loads(config) if config else None)


def read_vit_weights(path: str | Path) -> ViTWeights:
    """The backbone and image front end stored in ``path`` (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pretrained checkpoint not found: {path}")
    kind, config = _metadata_config(path)
    with safe_open(str(path), framework="pt", device="cpu") as f:
        keys = list(f.keys())
        # heads.<id>.patch_embed.proj.weight marks the head that holds the image front end
        heads = sorted({m.group(1) for k in keys if (m := re.match(r"heads\.([^.]+)\.patch_embed\.", k))})
        if len(heads) > 1:
            raise CheckpointError(f"{path}: several heads have an image front end ({', '.join(heads)}); "
                                  "save the one you want as a VisionTransformer checkpoint")
        head = f"heads.{heads[0]}." if heads else None
        tensors, dropped = {}, []
        for k in keys:
            if k.startswith("backbone."):
                name = k
            elif head and k.startswith(head) and _is_front_end(k[len(head):]):
                name = k[len(head):]
            elif not k.startswith("heads.") and (_is_front_end(k)):
                name = k
            elif kind == "Backbone" or (kind is None and k.startswith(("encoder.", "decoder."))):
                name = "backbone." + k
            else:
                dropped.append(k)
                continue
            tensors[name] = f.get_tensor(k)
    if not any(k.startswith("backbone.") for k in tensors):
        raise CheckpointError(f"{path}: no backbone weights found (expected keys 'backbone.encoder.*'); "
                              f"keys look like {', '.join(keys[:5])}")
    backbone = None
    if config is not None:
        data = config.get("backbone", config) if kind != "Backbone" else config
        try:
            backbone = BackboneConfig.from_dict(data, where=f"{path}: backbone config")
        except ConfigError:
            backbone = None
    weights = ViTWeights(tensors, str(path), backbone, dropped=dropped)
    weights.prefix_tokens = 1 if "cls_token" in tensors else (backbone.rel_pos_prefix if backbone else 1)
    weights.grid = _source_grid(weights, kind, config)
    return weights


def _source_grid(w: ViTWeights, kind: str | None, config: dict | None) -> tuple[int, int] | None:
    if kind == "VisionTransformer" and config:
        g = config["img_size"] // config["patch_size"]
        return g, g
    if w.backbone is not None and w.backbone.rel_pos == "2d" and w.backbone.rel_pos_grid:
        return tuple(w.backbone.rel_pos_grid)
    pos = w.tensors.get("pos_embed")
    if pos is not None:
        n = pos.shape[1] - w.prefix_tokens
        side = int(round(n ** 0.5))
        if side * side == n:
            return side, side
    table = w.tensors.get(REL_POS_TABLE)
    if table is not None:  # (2h-1)^2 + 3 rows for a square grid
        side = int(round((table.shape[0] - 3) ** 0.5))
        if side * side == table.shape[0] - 3 and side % 2:
            return (side + 1) // 2, (side + 1) // 2
    return None


def fit_vit_weights(weights: ViTWeights, target: Mapping[str, torch.Tensor], grid: Sequence[int],
                    backbone: BackboneConfig | None = None, prefix_tokens: int = 1) -> dict[str, torch.Tensor]:
    """``weights`` resized to a model whose state dict is ``target`` (VisionTransformer names)
    and whose patch grid is ``grid``. Raises ``CheckpointError`` naming the tensor when a
    shape cannot be made to fit, or when the file was trained with another backbone rule."""
    grid = tuple(grid)
    if backbone is not None and weights.backbone is not None:
        diff = [f"{f}: checkpoint {getattr(weights.backbone, f)!r} vs model {getattr(backbone, f)!r}"
                for f in _SAME_RULE if getattr(weights.backbone, f) != getattr(backbone, f)]
        if diff:
            raise CheckpointError(f"{weights.path} was trained with a different backbone rule: " + "; ".join(diff))
    out: dict[str, torch.Tensor] = {}
    for name, value in weights.tensors.items():
        if name not in target:
            continue
        want = target[name].shape
        if name == REL_POS_TABLE and value.shape != want:
            if weights.grid is None:
                raise CheckpointError(f"{weights.path}: cannot tell the patch grid of {name} {tuple(value.shape)}")
            value = resize_rel_pos_table(value, weights.grid, grid)
        elif name == "pos_embed" and value.shape != want:
            value = resize_pos_embed(value, grid, prefix_tokens, weights.grid)
        if value.shape != want:
            raise CheckpointError(f"{weights.path}: {name} has shape {tuple(value.shape)}, the model needs "
                                  f"{tuple(want)} (and it cannot be resized: check dim / depth / patch_size)")
        out[name] = value.to(target[name].dtype)
    return out


@dataclass
class LoadReport:
    loaded: list[str]
    missing: list[str]  # in the model, not in the file (keep their initialisation)
    unused: list[str]  # in the file, not in the model

    def __str__(self) -> str:
        def some(items):
            return ", ".join(items[:8]) + (f", ... (+{len(items) - 8})" if len(items) > 8 else "")

        return (f"loaded {len(self.loaded)} tensors; missing {len(self.missing)}"
                f"{': ' + some(self.missing) if self.missing else ''}; unused {len(self.unused)}"
                f"{': ' + some(self.unused) if self.unused else ''}")


def load_vit_weights(module: torch.nn.Module, weights: ViTWeights | str | Path, grid: Sequence[int],
                     backbone: BackboneConfig | None = None, prefix_tokens: int = 1,
                     only: Sequence[str] | None = None, strict_blocks: bool = True) -> LoadReport:
    """Load (resized) pretrained weights into ``module``, whose state dict uses
    VisionTransformer names. ``only``: load just names starting with these. With
    ``strict_blocks`` a transformer block weight the file lacks is an error (the file holds
    another architecture); other missing tensors keep their initialisation and are reported."""
    if not isinstance(weights, ViTWeights):
        weights = read_vit_weights(weights)
    own = module.state_dict()
    if only is not None:
        own = {k: v for k, v in own.items() if k.startswith(tuple(only))}
    fitted = fit_vit_weights(weights, own, grid, backbone, prefix_tokens)
    missing = [k for k in own if k not in fitted]
    blocks = [k for k in missing if ".layers." in k]
    if strict_blocks and blocks:
        raise CheckpointError(f"{weights.path} lacks {len(blocks)} transformer block weight(s) of this model, "
                              f"e.g. {', '.join(blocks[:5])}: it holds another architecture (depth, layer_scale, norm?)")
    module.load_state_dict(fitted, strict=False)
    considered = [k for k in weights.tensors if only is None or k.startswith(tuple(only))]
    unused = [k for k in considered if k not in fitted] + weights.dropped
    return LoadReport(sorted(fitted), missing, unused)


def main(argv: list[str] | None = None) -> int:
    """Convert a pretrained checkpoint for a segmentation config whose resolution differs
    (``init_from`` resizes by itself; a resized file serves other tools, e.g. mmseg)."""
    p = argparse.ArgumentParser(prog="python -m foundation_tasks.segmentation.pretrained",
                                description="Resize a pretrained ViT / MIM checkpoint to a segmentation "
                                            "config's patch grid, for init_from=.")
    p.add_argument("checkpoint", type=Path, help="VisionTransformer, MultiTaskModel (MIM run) or Backbone safetensors")
    p.add_argument("out", type=Path, help="output safetensors (backbone.* and the front end's tensors)")
    p.add_argument("--config", required=True, help="the segmentation training config (YAML)")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args(argv)
    from safetensors.torch import save_file

    from foundation.engine.config import load_config
    from foundation.engine.model import ModelConfig, MultiTaskModel

    cfg, specs = load_config(args.config, list(args.overrides) + ["init_from=null"], check_data=False)
    spec = next((s for s in specs if s.name == "segmentation"), None)
    if spec is None:
        raise SystemExit(f"{args.config}: no segmentation task")
    with torch.random.fork_rng(devices=[]):
        model = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, [spec]))
    head = model.heads[spec.id]
    state = {**{f"backbone.{k}": v for k, v in model.backbone.state_dict().items()},
             **{k: v for k, v in head.state_dict().items() if _is_front_end(k)}}
    weights = read_vit_weights(args.checkpoint)
    fitted = fit_vit_weights(weights, state, head.grid, cfg.backbone, head.num_prefix_tokens)
    out = {k if k.startswith("backbone.") else f"heads.{spec.id}.{k}": v.contiguous() for k, v in fitted.items()}
    save_file(out, str(args.out))
    print(f"wrote {args.out}: {len(out)} tensors for a {head.grid[0]}x{head.grid[1]} patch grid "
          f"(from {weights.grid}); train with init_from={args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
