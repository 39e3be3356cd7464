"""BEiT v2's released VQ-KD tokenizers -> a tokenizer run checkpoint of ours.

    python -m foundation_tasks.vq_tokenizer.convert vqkd_encoder_base_decoder_3x768x12_clip-d5036aa7.pth \\
        checkpoints/beit2-tokenizer.safetensors
    # then, in a MIM config:  tokenizer: checkpoints/beit2-tokenizer.safetensors

The released file (``microsoft/unilm`` ``beit2``, ``modeling_vqkd.VQKD``) holds a Pre-LN
ViT encoder with mean-pooling LayerNorm (``fc_norm``, applied per patch token), its
``encode_task_layer``, the ``NormEMAVectorQuantizer`` codebook, a small ViT decoder whose
"patch embedding" is a 1x1 convolution of the codes, and ``decode_task_layer``. Keys map
one to one (below); the teacher (``teacher_model.*``) and ``scaling_layer.*`` are left
out, as BEiT v2 itself does when it loads the file as a tokenizer. BEiT v2 feeds the
encoder images in [-1, 1]: the converted config says ``input_norm: unit``, and our
pipeline's ImageNet-normalised images are converted on the way in.

    encoder.patch_embed.proj.*            heads.T.patch_embed.proj.*
    encoder.cls_token / pos_embed         heads.T.cls_token / pos_embed
    encoder.blocks.i.attn.qkv.weight      backbone.encoder.layers.i.attn.qkv.weight
    encoder.blocks.i.attn.{q,v}_bias      backbone.encoder.layers.i.attn.qkv.bias (k bias 0)
    encoder.blocks.i.{norm1,norm2,attn.proj,mlp.fc1,mlp.fc2}.*   the same names under layers.i
    encoder.blocks.i.gamma_{1,2}          backbone.encoder.layers.i.ls{1,2}.gamma
    encoder.fc_norm.* (or norm.*)         backbone.encoder.norm.*
    encode_task_layer.* / decode_task_layer.*   heads.T.encode_task_layer.* / decode_task_layer.*
    quantize.embedding.weight             heads.T.quantize.codebook
    quantize.cluster_size                 heads.T.quantize.usage
    quantize.embedding.initted            heads.T.quantize.initted
    decoder.patch_embed.proj.*            heads.T.decoder_embed.*   (1x1 conv -> linear)
    decoder.cls_token / pos_embed         heads.T.decoder_cls_token / decoder_pos_embed
    decoder.blocks.i.* / decoder.fc_norm  heads.T.decoder.encoder.layers.i.* / .norm
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import Mapping, Optional

import torch

from foundation import checkpoint
from foundation.checkpoint import CheckpointError
from foundation.config import BackboneConfig

# what BEiT v2 drops when it loads a VQKD file as a tokenizer, and the quantizer's
# unused EMA statistics
IGNORED = ("teacher_model.", "scaling_layer.", "loss", "quantize.embedding.cluster_size", "quantize.embedding.embed_avg")
_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")
_SAME = ("norm1.", "norm2.", "attn.proj.", "mlp.fc1.", "mlp.fc2.", "attn.qkv.weight")


def _vit(state: Mapping[str, torch.Tensor], src: str, dst: str) -> tuple[dict[str, torch.Tensor], set[str]]:
    """A BEiT ViT's blocks and final norm (``src``, e.g. "encoder.") -> our Stack keys
    (``dst``); returns (tensors, the source keys used)."""
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    biases: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        if not key.startswith(src):
            continue
        rest = key[len(src):]
        m = _BLOCK.match(rest)
        if m:
            i, name = int(m.group(1)), m.group(2)
            if name.startswith(_SAME):
                out[f"{dst}layers.{i}.{name}"] = value
            elif name in ("attn.q_bias", "attn.v_bias"):
                biases.setdefault(i, {})[name[5]] = value
            elif name in ("gamma_1", "gamma_2"):
                out[f"{dst}layers.{i}.ls{name[-1]}.gamma"] = value
            else:
                continue
        elif rest.startswith(("fc_norm.", "norm.")):  # mean pooling: fc_norm (norm is Identity); else norm
            out[f"{dst}norm.{rest.split('.', 1)[1]}"] = value
        else:
            continue
        used.add(key)
    for i, b in biases.items():
        out[f"{dst}layers.{i}.attn.qkv.bias"] = torch.cat([b["q"], torch.zeros_like(b["q"]), b["v"]])
    return out, used


def _depth(state: Mapping[str, torch.Tensor], src: str) -> int:
    layers = {int(m.group(1)) for k in state if k.startswith(src) and (m := _BLOCK.match(k[len(src):]))}
    return max(layers) + 1 if layers else 0


def beit2_model_config(state: Mapping[str, torch.Tensor], heads: Optional[int] = None,
                       decoder_heads: Optional[int] = None, task_id: str = "vq_tokenizer"):
    """Our ``ModelConfig`` for a BEiT v2 VQKD state dict. Sizes come from the tensors;
    head counts are not in them: default width / 64 (BEiT's head size)."""
    from foundation.engine.model import ModelConfig

    dim = state["encoder.cls_token"].shape[-1]
    patch = state["encoder.patch_embed.proj.weight"].shape[-1]
    grid = math.isqrt(state["encoder.pos_embed"].shape[1] - 1)
    dec_dim = state["decoder.cls_token"].shape[-1]
    num_codes, code_dim = state["quantize.embedding.weight"].shape
    block0 = "encoder.blocks.0."
    backbone = BackboneConfig(dim=dim, depth=_depth(state, "encoder."), heads=heads or dim // 64,
                              ffn_dim=state[block0 + "mlp.fc1.weight"].shape[0], norm="preln", layernorm_eps=1e-6,
                              qkv_bias=block0 + "attn.q_bias" in state,
                              layer_scale=1.0 if block0 + "gamma_1" in state else None)
    task = dict(name="vq_tokenizer", id=task_id, img_size=grid * patch, patch_size=patch, num_codes=num_codes,
                code_dim=code_dim, decoder_depth=_depth(state, "decoder."), decoder_dim=dec_dim,
                decoder_heads=decoder_heads or dec_dim // 64, teacher="clip", clip_model="ViT-B-16",
                target_dim=state["decode_task_layer.2.weight"].shape[0],
                rec_loss="cosine", input_norm="unit")
    return ModelConfig(backbone=backbone, tasks=[task])


def from_beit2(state: Mapping[str, torch.Tensor], task_id: str = "vq_tokenizer") -> tuple[dict[str, torch.Tensor], list[str]]:
    """(our state dict, the keys left out on purpose). Any other key left over is an error."""
    h = f"heads.{task_id}."
    enc, used = _vit(state, "encoder.", "encoder.")
    dec, used_dec = _vit(state, "decoder.", "encoder.")
    out = {f"backbone.{k}": v for k, v in enc.items()}
    out.update({f"{h}decoder.{k}": v for k, v in dec.items()})
    used |= used_dec | {"decoder.patch_embed.proj.weight", "quantize.embedding.initted"}
    for ours, theirs in (("patch_embed.proj.weight", "encoder.patch_embed.proj.weight"),
                         ("patch_embed.proj.bias", "encoder.patch_embed.proj.bias"),
                         ("cls_token", "encoder.cls_token"), ("pos_embed", "encoder.pos_embed"),
                         ("decoder_cls_token", "decoder.cls_token"), ("decoder_pos_embed", "decoder.pos_embed"),
                         ("decoder_embed.bias", "decoder.patch_embed.proj.bias"),
                         ("quantize.codebook", "quantize.embedding.weight"), ("quantize.usage", "quantize.cluster_size")):
        if theirs in state:
            out[h + ours] = state[theirs]
            used.add(theirs)
    out[h + "decoder_embed.weight"] = state["decoder.patch_embed.proj.weight"].flatten(1)  # (D, d, 1, 1) -> (D, d)
    out[h + "quantize.initted"] = state.get("quantize.embedding.initted", torch.ones(1)).reshape(()).float()
    for k, v in state.items():
        if k.startswith(("encode_task_layer.", "decode_task_layer.")):
            out[h + k] = v
            used.add(k)
    if "quantize.cluster_size" not in state:
        out[h + "quantize.usage"] = torch.zeros(state["quantize.embedding.weight"].shape[0])
    ignored = [k for k in state if k.startswith(IGNORED)]
    left = [k for k in state if k not in used and k not in ignored]
    if left:
        raise CheckpointError(f"BEiT v2 tokenizer: {len(left)} key(s) this converter does not know: "
                              f"{', '.join(sorted(left)[:10])}")
    return out, ignored


def read_beit2(path: str | Path) -> dict[str, torch.Tensor]:
    """The state dict of a released ``.pth`` (``{"model": ...}``), read with ``weights_only``."""
    obj = torch.load(str(path), map_location="cpu", weights_only=True)
    for key in ("model", "state_dict"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            return obj[key]
    return obj


def convert(state: Mapping[str, torch.Tensor], out: str | Path, *, heads: Optional[int] = None,
            decoder_heads: Optional[int] = None, log=print) -> Path:
    """Write our tokenizer checkpoint for a BEiT v2 VQKD state dict; strict: every key of
    ours is filled, every key of theirs is used or knowingly left out."""
    from foundation.engine.model import MultiTaskModel

    config = beit2_model_config(state, heads, decoder_heads)
    converted, ignored = from_beit2(state)
    with torch.random.fork_rng(devices=[]):
        model = MultiTaskModel(config)
    checkpoint.load_state_into(model, converted, where="converted BEiT v2 tokenizer")
    path = checkpoint.save(model, out)
    log(f"wrote {path}: {len(converted)} tensors; left out {len(ignored)} (teacher / scaling layer / unused "
        f"quantizer statistics)")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m foundation_tasks.vq_tokenizer.convert",
                                description="Convert a BEiT v2 VQ-KD tokenizer (.pth) into our checkpoint format.")
    p.add_argument("src", help="the released .pth (e.g. vqkd_encoder_base_decoder_3x768x12_clip-d5036aa7.pth)")
    p.add_argument("out", help="output .safetensors")
    p.add_argument("--heads", type=int, help="encoder attention heads (default width / 64)")
    p.add_argument("--decoder-heads", type=int, help="decoder attention heads (default width / 64)")
    a = p.parse_args(argv)
    try:
        convert(read_beit2(a.src), a.out, heads=a.heads, decoder_heads=a.decoder_heads)
    except (CheckpointError, KeyError, OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
