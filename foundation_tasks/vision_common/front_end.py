"""The vision heads' front end (``foundation.embed.ViTFrontEnd``): the backbone checks it
needs, and copying a pretrained one out of a checkpoint.

Every vision head (classification, mim, vq_tokenizer, segmentation) is a ``ViTFrontEnd``
subclass, so its front end tensors carry ``foundation.vit.VisionTransformer``'s names
(``patch_embed.*``, ``cls_token``, ``pos_embed``) below its ``heads.<task id>.`` prefix, and
pretrained front-end weights load into any of them by name.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

import torch

from foundation.checkpoint import sub_state
from foundation.config import BackboneConfig, ConfigError
from foundation.embed import ViTFrontEnd, resize_pos_embed

FRONT_END = ("patch_embed.", "cls_token", "pos_embed")  # names (prefixes) of the front end's tensors


def check_vision_backbone(backbone: BackboneConfig, img_size: int, patch_size: int, multiway: bool = False) -> None:
    """The backbone and the patch grid fit a ViT front end (one class token). ``multiway``:
    the head routes its tokens to the ``vision`` expert of a multiway backbone."""
    if backbone.arch != "encoder" or (backbone.experts and not multiway):
        raise ConfigError(f"field 'backbone.arch': vision tasks need a plain encoder (got arch={backbone.arch!r}, "
                          f"experts={list(backbone.experts)})")
    if backbone.experts and "vision" not in backbone.experts:
        raise ConfigError(f"field 'backbone.experts': the image tokens take the 'vision' expert, which "
                          f"{list(backbone.experts)} lacks")
    if img_size % patch_size:
        raise ConfigError(f"field 'img_size': {img_size} is not a multiple of patch_size={patch_size}")
    grid = [img_size // patch_size] * 2
    if backbone.rel_pos == "2d" and (list(backbone.rel_pos_grid) != grid or backbone.rel_pos_prefix != 1):
        raise ConfigError(f"field 'backbone.rel_pos_grid': must be the patch grid {grid} with rel_pos_prefix 1 "
                          f"(got {backbone.rel_pos_grid}, {backbone.rel_pos_prefix})")


def modules_holding(state: Mapping[str, torch.Tensor], key: str) -> dict[str, dict[str, torch.Tensor]]:
    """{prefix: its tensors without the prefix} for each module of a file that holds the
    tensor ``key``: ``""`` for the file's top level (all but ``backbone.*``), and
    ``"heads.<id>."`` for each head of one of our runs (``MultiTaskModel``) that holds it."""
    found = {}
    if key in state:
        found[""] = {k: v for k, v in state.items() if not k.startswith("backbone.")}
    for head_id in sorted({k.split(".", 2)[1] for k in state if k.startswith("heads.") and k.count(".") >= 2}):
        sub = sub_state(state, f"heads.{head_id}.")
        if key in sub:
            found[f"heads.{head_id}."] = sub
    return found


def load_front_end(head: ViTFrontEnd, path: str | Path, log: Callable[[str], None] = print) -> dict[str, list[str]]:
    """Copy ``patch_embed`` / ``cls_token`` / ``pos_embed`` from a checkpoint into ``head``.

    The file is a run's ``model.safetensors`` (a MIM, tokenizer or classification run: its
    one vision head's front end is used) or a ``VisionTransformer`` file. The position
    embedding is resampled when the patch grids differ. Returns (and logs) what was
    loaded, what kept its initialisation and which tensors of the source head were left.
    """
    from safetensors.torch import load_file

    found = modules_holding(load_file(str(path)), "patch_embed.proj.weight")
    if len(found) != 1:
        names = ", ".join(p or "(top level)" for p in found) or "none"
        raise ValueError(f"{path}: expected one vision front end (patch_embed.proj.weight), found {names}")
    (prefix, source), = found.items()
    own = head.state_dict()
    loaded, fitted = [], {}
    for name in own:
        if not name.startswith(FRONT_END) or name not in source:
            continue
        value = source[name]
        if name == "pos_embed" and value.shape != own[name].shape and value.shape[-1] == own[name].shape[-1]:
            value = resize_pos_embed(value, head.grid, head.num_prefix_tokens)
        if value.shape != own[name].shape:
            raise ValueError(f"{path}: {prefix}{name} has shape {tuple(source[name].shape)}, this head needs "
                             f"{tuple(own[name].shape)}")
        fitted[name] = value
        loaded.append(name)
    head.load_state_dict(fitted, strict=False)
    report = {
        "loaded": loaded,
        "missing": [k for k in own if k not in fitted],
        "unused": [k for k in source if k not in fitted],
    }
    log(f"front end from {path} ({prefix or 'top level'}): loaded {', '.join(loaded) or 'nothing'}; "
        f"kept their initialisation: {', '.join(report['missing']) or 'none'}; "
        f"not used: {', '.join(report['unused']) or 'none'}")
    return report


def vision_encoder(path: str | Path, img_size: int, patch_size: int, load: bool = True):
    """(front end, backbone) of one of our vision runs (a MIM, tokenizer or classification run's
    ``model.safetensors``), built at ``img_size`` / ``patch_size`` (positions resampled when the
    run's grid differs); ``load=False``: the same architecture at initialisation."""
    from safetensors.torch import load_file

    from foundation import checkpoint
    from foundation.engine import model as _engine_model  # noqa: F401  registers the MultiTaskModel kind
    from foundation.transformer import Backbone

    _, config = checkpoint.read_config(path)
    backbone = Backbone(config.backbone)
    embed = ViTFrontEnd(config.backbone.dim, img_size, patch_size)
    if load:
        state = {k[len("backbone."):]: v for k, v in load_file(str(path)).items() if k.startswith("backbone.")}
        checkpoint.load_state_into(backbone, state, where=f"{path} (backbone)")
        load_front_end(embed, path, log=lambda s: None)
    return embed, backbone
