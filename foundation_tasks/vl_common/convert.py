"""Converters between BEiT-3 checkpoints and ours.

* ``from_torchscale_beit3(model)``: torchscale 0.3.0's ``BEiT3`` module -> our ``BEiT3``
  computing the same function (the parity tests check image-only, text-only and pair
  inputs, with padding and masked patches). ``to_torchscale_beit3`` goes back.
* ``convert_released(path)``: a released BEiT-3 checkpoint (microsoft/unilm ``beit3``:
  ``beit3_base_patch16_224.pth``, ``beit3_base_patch16_480_vqa.pth``, ...; keys
  ``beit3.text_embed``, ``beit3.vision_embed``, ``beit3.encoder.layers.*.{A,B}``, and the
  task heads ``pooler.*`` / ``head.*``) -> one safetensors file with ``backbone.*`` (what
  ``embed.*`` and the head's keys, all of which the engine's ``init_from`` reads (the
  head with the task's ``pretrained_head: true``). The architecture is read off the tensors' shapes; only the
  number of heads is not in them (12 for base, 16 for large, 16 for Magneto's 544-dim).
  It builds torchscale's own ``BEiT3`` and loads the weights into it strictly first, so a
  checkpoint of another architecture is refused by the official code itself.

    python -m foundation_tasks.vl_common.convert beit3_base_patch16_480_vqa.pth beit3_base_vqa.safetensors
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Mapping

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from foundation.checkpoint import (CheckpointError, from_torchscale, import_torchscale, load_state_into, to_torchscale,
                                   torchscale_args, torchscale_norm_flags)
from foundation.config import to_dict
from foundation.scaling import NORMS
from foundation_tasks.vl_common.beit3 import EXPERTS, BEiT3, BEiT3Config, resize_vision_pos

POSITION_OFFSET = 2  # torchscale's (fairseq's) position tables start at row 2
DEFAULT_HEADS = {544: 16, 768: 12, 1024: 16}
META_CONFIG, META_HEAD = "beit3.config", "beit3.head"
HEAD_PREFIXES = {"vqa": ("pooler.", "head."), "nlvr2": ("head.",)}


def import_torchscale_beit3():
    """torchscale's ``(EncoderConfig, BEiT3)``, with fairscale stubbed when absent."""
    EncoderConfig, _ = import_torchscale()
    from torchscale.model.BEiT3 import BEiT3 as TorchscaleBEiT3

    return EncoderConfig, TorchscaleBEiT3


# --------------------------------------------------------------------------- torchscale module <-> ours


def from_torchscale_beit3(model: nn.Module) -> BEiT3:
    """Our ``BEiT3`` computing what torchscale's ``BEiT3`` module computes (eval mode)."""
    enc = model.encoder
    if getattr(enc, "output_projection", None) is not None:
        raise ValueError("torchscale BEiT3 built with no_output_layer=False projects its output to the "
                         "vocabulary; the released BEiT-3 models use no_output_layer=True")
    backbone = from_torchscale(enc, EXPERTS, ignore=("embed_positions",))
    ve = model.vision_embed
    if ve.mask_token is None or ve.cls_token is None:
        raise ValueError("torchscale VisionEmbedding without a class or mask token is not BEiT-3's")
    config = BEiT3Config(
        backbone=backbone.config, vocab_size=model.text_embed.num_embeddings, img_size=ve.img_size[0],
        patch_size=ve.patch_size[0], in_chans=ve.proj.in_channels,
        text_positions=enc.embed_positions.B.num_embeddings - POSITION_OFFSET,
    )
    ours = BEiT3(config)
    state = {f"backbone.{k}": v for k, v in backbone.state_dict().items()}
    state.update(_embed_from_torchscale({
        "text_embed.weight": model.text_embed.weight,
        "vision_embed.proj.weight": ve.proj.weight, "vision_embed.proj.bias": ve.proj.bias,
        "vision_embed.cls_token": ve.cls_token, "vision_embed.mask_token": ve.mask_token,
        "encoder.embed_positions.A.weight": enc.embed_positions.A.weight,
        "encoder.embed_positions.B.weight": enc.embed_positions.B.weight,
    }))
    load_state_into(ours, {k: v.detach().clone() for k, v in state.items()}, where="converted torchscale BEiT3")
    return ours.train(model.training)


# (ours without "embed.", torchscale's without "beit3.")
_EMBED_KEYS = (
    ("text_embed.weight", "text_embed.weight"),
    ("patch_embed.proj.weight", "vision_embed.proj.weight"),
    ("patch_embed.proj.bias", "vision_embed.proj.bias"),
    ("cls_token", "vision_embed.cls_token"),
    ("mask_token", "vision_embed.mask_token"),
)


def _embed_from_torchscale(ts: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {f"embed.{ours}": ts[theirs] for ours, theirs in _EMBED_KEYS}
    out["embed.vision_pos"] = ts["encoder.embed_positions.A.weight"][POSITION_OFFSET:]
    out["embed.text_pos"] = ts["encoder.embed_positions.B.weight"][POSITION_OFFSET:]
    return out


def to_torchscale_beit3(model: BEiT3) -> dict[str, torch.Tensor]:
    """State dict of torchscale's ``BEiT3`` (no ``beit3.`` prefix) for our ``BEiT3``; the
    two unused leading position rows are zeros."""
    out = {f"encoder.{k}": v for k, v in to_torchscale(model.backbone).items()}
    emb = model.embed.state_dict()
    for ours, theirs in _EMBED_KEYS:
        out[theirs] = emb[ours].clone()
    for name, table in (("A", emb["vision_pos"]), ("B", emb["text_pos"])):
        out[f"encoder.embed_positions.{name}.weight"] = torch.cat([table.new_zeros(POSITION_OFFSET, table.shape[1]), table])
    return out


def torchscale_beit3_args(config: BEiT3Config) -> dict:
    """``EncoderConfig(**torchscale_beit3_args(cfg))`` builds the torchscale BEiT3 of ``cfg``."""
    return dict(torchscale_args(config.backbone), vocab_size=config.vocab_size, img_size=config.img_size,
                patch_size=config.patch_size, in_chans=config.in_chans,
                max_source_positions=config.text_positions + POSITION_OFFSET, no_output_layer=True,
                layernorm_embedding=False)


# --------------------------------------------------------------------------- released checkpoints


def read_state(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a ``.pth`` (``{"model": state}``, ``{"module": state}`` or a state dict,
    read with ``weights_only=True``) or a ``.safetensors`` file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.suffix == ".safetensors":
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - pickles with arbitrary objects are refused here
        raise CheckpointError(f"{path}: not readable as tensors with torch.load(weights_only=True): {e}") from None
    for key in ("model", "module", "state_dict"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path}: expected a state dict (or one under 'model' / 'module')")
    return obj


def released_args(state: Mapping[str, torch.Tensor], heads: int | None = None, norm: str | None = None) -> dict:
    """torchscale ``EncoderConfig`` arguments of a released BEiT-3 state dict (``beit3.*`` keys)."""
    def need(key: str) -> torch.Tensor:
        if key not in state:
            raise CheckpointError(f"not a BEiT-3 checkpoint: no {key!r} (keys look like "
                                  f"{', '.join(list(state)[:5])} ...)")
        return state[key]

    tokens = need("beit3.text_embed.weight")
    vocab, dim = tokens.shape
    layer_ids = {int(m.group(1)) for k in state if (m := re.match(r"beit3\.encoder\.layers\.(\d+)\.", k))}
    if not layer_ids:
        raise CheckpointError("not a BEiT-3 checkpoint: no beit3.encoder.layers.*")
    proj = need("beit3.vision_embed.proj.weight")
    patch, in_chans = proj.shape[-1], proj.shape[1]
    rows = need("beit3.encoder.embed_positions.A.weight").shape[0] - POSITION_OFFSET - 1
    side = int(round(rows ** 0.5))
    if side * side != rows:
        raise CheckpointError(f"vision positions: {rows} patch rows is not a square grid")
    subln = "beit3.encoder.layers.0.self_attn.inner_attn_ln.A.weight" in state
    norm = norm or ("magneto" if subln else None)
    if norm is None:
        raise CheckpointError("the checkpoint has no Sub-LN weights, so it is not Magneto; say which rule it "
                              "uses with --norm preln|postln|deepnorm")
    heads = heads or DEFAULT_HEADS.get(dim)
    if heads is None:
        raise CheckpointError(f"dim {dim}: the number of attention heads is not in the weights; pass --heads")
    return dict(
        encoder_embed_dim=dim, encoder_attention_heads=heads,
        encoder_ffn_embed_dim=need("beit3.encoder.layers.0.ffn.A.fc1.weight").shape[0],
        encoder_layers=max(layer_ids) + 1, vocab_size=vocab, multiway=True, layernorm_embedding=False,
        normalize_output="beit3.encoder.layer_norm.A.weight" in state, no_output_layer=True,
        img_size=side * patch, patch_size=patch, in_chans=in_chans,
        max_source_positions=need("beit3.encoder.embed_positions.B.weight").shape[0],
        **torchscale_norm_flags(norm),
    )


def head_kind(state: Mapping[str, torch.Tensor]) -> str:
    """'vqa' (pooler + 4-layer MLP), 'nlvr2' (TwoLayerMLP) or '' (no task head)."""
    if "pooler.dense.weight" in state and "head.3.weight" in state:
        return "vqa"
    if "head.dense1.weight" in state and "head.dense2.weight" in state:
        return "nlvr2"
    return ""


def convert_released(path: str | Path, heads: int | None = None, norm: str | None = None
                     ) -> tuple[BEiT3, dict[str, torch.Tensor], str]:
    """(our BEiT3, the task head's tensors under their BEiT-3 names, head kind) of a
    released checkpoint; needs torchscale 0.3.0 (``pip install --no-deps torchscale==0.3.0``)."""
    state = read_state(path)
    EncoderConfig, TorchscaleBEiT3 = import_torchscale_beit3()
    args = released_args(state, heads, norm)
    ts = TorchscaleBEiT3(EncoderConfig(**args)).eval()
    kind = head_kind(state)
    head = {k: v for k, v in state.items() if kind and k.startswith(HEAD_PREFIXES[kind])}
    body = {k[len("beit3."):]: v for k, v in state.items() if k.startswith("beit3.")}
    ignored = sorted(set(state) - set(head) - {f"beit3.{k}" for k in body})
    result = ts.load_state_dict(body, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise CheckpointError(f"{path}: does not load into torchscale's BEiT3 built from its shapes ({args}): "
                              f"missing {result.missing_keys[:8]}, unexpected {result.unexpected_keys[:8]}")
    if ignored:
        print(f"{path}: ignoring {len(ignored)} tensors outside BEiT-3 and its head: {', '.join(ignored[:8])}",
              file=sys.stderr)
    return from_torchscale_beit3(ts), head, kind


def save_converted(model: BEiT3, head: Mapping[str, torch.Tensor], kind: str, out: str | Path) -> Path:
    """``backbone.*`` + ``embed.*`` + head tensors, with the BEiT3 config in the metadata."""
    tensors = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    tensors.update({k: v.detach().contiguous().clone() for k, v in head.items()})
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out), metadata={META_CONFIG: json.dumps(to_dict(model.config)), META_HEAD: kind})
    return out


def load_beit3(path: str | Path) -> BEiT3:
    """The standalone ``BEiT3`` of a converted file (its head tensors, if any, are left out)."""
    path = Path(path)
    with safe_open(str(path), framework="pt", device="cpu") as f:
        meta = f.metadata() or {}
        if META_CONFIG not in meta:
            raise CheckpointError(f"{path}: no {META_CONFIG!r} metadata; not written by foundation_tasks.vl_common.convert")
        state = {k: f.get_tensor(k) for k in f.keys() if k.startswith(("backbone.", "embed."))}
    model = BEiT3(BEiT3Config.from_dict(json.loads(meta[META_CONFIG]), where=str(path)))
    return load_state_into(model, state, where=str(path))


# --------------------------------------------------------------------------- what a task reads


def find_embedding(state: Mapping[str, torch.Tensor], where: str) -> tuple[str, dict[str, torch.Tensor]]:
    """(prefix, ``embed.*`` tensors without the prefix) of the first BEiT-3 embedding in a file:
    ``embed.`` in converted files, ``heads.<task id>.embed.`` in our runs' checkpoints."""
    prefixes = sorted(k[: -len("embed.text_embed.weight")] for k in state if k.endswith("embed.text_embed.weight"))
    if not prefixes:
        raise CheckpointError(f"{where}: no BEiT-3 embedding in it (no '*embed.text_embed.weight'); expected a "
                              "pretraining run's model.safetensors or a foundation_tasks.vl_common.convert output")
    prefix = prefixes[0] + "embed."
    return prefixes[0], {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def load_embedding(embed: nn.Module, state: Mapping[str, torch.Tensor], where: str) -> None:
    """Strictly load an embedding's tensors, resizing the vision positions to ``embed``'s grid."""
    state = dict(state)
    if "vision_pos" in state:
        state["vision_pos"] = resize_vision_pos(state["vision_pos"], embed.grid)
    own = embed.state_dict()
    problems = sorted(set(own) ^ set(state)) + [
        f"{k}: {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in own if k in state and state[k].shape != own[k].shape
    ]
    if problems:
        raise CheckpointError(f"{where}: the BEiT-3 embedding does not fit this task's: "
                              + "; ".join(problems[:10]))
    embed.load_state_dict(state)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m foundation_tasks.vl_common.convert", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="released BEiT-3 checkpoint (.pth or .safetensors)")
    p.add_argument("out", help="output .safetensors")
    p.add_argument("--heads", type=int, help="attention heads (default: 12 for dim 768, 16 for 1024 and 544)")
    p.add_argument("--norm", choices=NORMS,
                   help="residual rule (default: magneto when the weights have Sub-LN)")
    a = p.parse_args(argv)
    try:
        model, head, kind = convert_released(a.source, a.heads, a.norm)
    except (CheckpointError, FileNotFoundError, ImportError) as e:
        print(f"convert: error: {e}", file=sys.stderr)
        return 2
    out = save_converted(model, head, kind, a.out)
    c = model.config
    print(f"wrote {out}: BEiT-3 {c.backbone.depth} layers, dim {c.backbone.dim}, {c.backbone.heads} heads, "
          f"{c.backbone.norm}, final_norm={c.backbone.final_norm}, {c.img_size}px / patch {c.patch_size}, "
          f"vocab {c.vocab_size}; head: {kind or 'none'}")
    print("use it: init_from: OUT (the backbone and the embedding"
          + ("; with the task's pretrained_head: true the head)" if kind else ")"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
