"""Encoder, decoder and encoder-decoder stacks, and the ``Backbone`` that holds them."""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from foundation.block import Block, init_block
from foundation.config import BackboneConfig
from foundation.layers import RelativePositionBias1d, RelativePositionBias2d, attention_mask, compute_dtype
from foundation.multiway import Segments, merge_segments, per_expert, route
from foundation.scaling import NormRule, StackScales, stack_rules


class Stack(nn.Module):
    """``depth`` blocks, an optional shared relative position bias, the rule's final LN."""

    def __init__(self, cfg: BackboneConfig, depth: int, rule: NormRule, *, causal: bool, cross: bool):
        super().__init__()
        self.rule, self.causal, self.checkpointing = rule, causal, cfg.checkpoint_activations
        # plain Python, so the model can also be built on the meta device (FSDP)
        rates = [cfg.drop_path * i / (depth - 1) for i in range(depth)] if depth > 1 else [cfg.drop_path]
        self.layers = nn.ModuleList(
            Block(cfg, rule, cross=cross, drop_path=rates[i],
                  vl_expert=i >= depth - cfg.vl_expert_layers)
            for i in range(depth)
        )
        if cfg.rel_pos == "1d":
            self.rel_pos = RelativePositionBias1d(cfg.heads, cfg.rel_pos_buckets, cfg.rel_pos_max_distance)
        elif cfg.rel_pos == "2d":
            self.rel_pos = RelativePositionBias2d(cfg.heads, cfg.rel_pos_grid, cfg.rel_pos_prefix)
        else:
            self.rel_pos = None
        norm = lambda: nn.LayerNorm(cfg.dim, eps=cfg.layernorm_eps)  # noqa: E731
        self.norm = per_expert(cfg.experts, norm) if rule.final_norm else None

    def forward(self, x, padding_mask=None, attn_mask=None, segments=None, return_layers=None, memory=None,
                memory_padding_mask=None, stop_early=False) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """(output, {layer: hidden}); the arguments are ``Backbone.forward``'s (checked there),
        ``memory`` the encoder's output for a decoder's cross-attention. ``stop_early``: skip
        the layers after the last of ``return_layers`` (timm's
        ``forward_intermediates(stop_early=True)``); the final norm then applies to that layer."""
        B, T, _ = x.shape
        if padding_mask is not None:  # padded positions carry zeros, whatever the caller put there
            x = x.masked_fill(padding_mask[..., None], 0.0)
        bias = self.rel_pos(T) if self.rel_pos is not None else None
        mask, is_causal = attention_mask(
            B, T, T, padding_mask=padding_mask, attn_mask=attn_mask, bias=bias,
            causal=self.causal, dtype=compute_dtype(x), device=x.device,
        )
        memory_mask = None
        if memory is not None and memory_padding_mask is not None:
            memory_mask, _ = attention_mask(B, T, memory.shape[1], padding_mask=memory_padding_mask)
        wanted = _layer_indices(return_layers, len(self.layers))
        hidden: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            if self.checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(layer, x, segments, mask, is_causal, memory, memory_mask, use_reentrant=False)
            else:
                x = layer(x, segments, mask, is_causal, memory, memory_mask)
            if i in wanted:
                hidden[wanted[i]] = x
                if stop_early and len(hidden) == len(wanted):
                    break
        if self.norm is not None:
            x = route(self.norm, x, segments)
        return x, hidden


def post_norm_inputs(model: nn.Module) -> set[int]:
    """ids of the self-attentions whose input no LayerNorm precedes: the first layer of each
    stack whose rule normalises after the residual (Post-LN, DeepNorm), which reads the embedding."""
    return {id(s.layers[0].attn) for s in model.modules()
            if isinstance(s, Stack) and not s.rule.pre_norm and len(s.layers)}


def _layer_indices(return_layers: Iterable[int] | None, depth: int) -> dict[int, int]:
    """{normalised index: index as the caller wrote it}; negative indices count from the end."""
    out = {}
    for i in return_layers or ():
        j = i + depth if i < 0 else i
        if not 0 <= j < depth:
            raise ValueError(f"return_layers: layer {i} does not exist in a {depth}-layer stack")
        out[j] = i
    return out


class Backbone(nn.Module):
    """The shared Transformer: ``(B, T, dim)`` embeddings in, hidden states out.

    ``forward(x, padding_mask=None, attn_mask=None, segments=None, return_layers=None)``
    returns ``(B, T, dim)``, or ``(final, {layer: hidden})`` when ``return_layers`` (0-based
    block indices, as mmseg's ``out_indices``) is given. For ``arch="encoder_decoder"`` pass
    the decoder input as ``decoder_x`` (and ``decoder_padding_mask``); ``encode`` and
    ``decode`` run the halves separately.
    """

    def __init__(self, config: BackboneConfig):
        super().__init__()
        if not isinstance(config, BackboneConfig):
            raise TypeError(f"Backbone needs a BackboneConfig, got {type(config).__name__}")
        self.config = cfg = config
        self.dim = self.num_features = cfg.dim
        n_enc = cfg.depth if cfg.arch != "decoder" else 0
        n_dec = {"encoder": 0, "decoder": cfg.depth, "encoder_decoder": cfg.decoder_depth}[cfg.arch]
        rules = stack_rules(
            cfg.norm, cfg.arch, n_enc, n_dec, residual_scale=cfg.residual_scale,
            init_gain=cfg.init_gain, variant=cfg.init_variant, final_norm=cfg.final_norm is not False,
        )
        self.scales = {name: StackScales(r.alpha, r.gain) for name, r in rules.items()}
        enc, dec = rules.get("encoder"), rules.get("decoder")
        self.encoder = Stack(cfg, n_enc, enc, causal=False, cross=False) if enc else None
        self.decoder = (
            Stack(cfg, n_dec, dec, causal=True, cross=cfg.arch == "encoder_decoder")
            if dec else None
        )
        self.init_weights()

    def init_weights(self) -> None:
        """Standard init of every block, then the rule's gain (see ``init_block``)."""
        for stack in (self.encoder, self.decoder):
            if stack is None:
                continue
            for layer in stack.layers:
                init_block(layer, variant=self.config.init_variant)
            if stack.norm is not None:
                for m in stack.norm.modules():
                    if isinstance(m, nn.LayerNorm):
                        m.reset_parameters()

    @property
    def main(self) -> Stack:
        """The stack whose output ``forward`` returns."""
        return self.decoder if self.decoder is not None else self.encoder

    def output_size(self) -> int:
        return self.dim

    def forward(
        self,
        x: torch.Tensor,
        padding_mask: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        segments: Segments | None = None,
        return_layers: Iterable[int] | None = None,
        *,
        decoder_x: torch.Tensor | None = None,
        decoder_padding_mask: torch.Tensor | None = None,
        stop_early: bool = False,
    ):
        if self.config.arch == "encoder_decoder":
            if decoder_x is None:
                raise ValueError("arch='encoder_decoder': pass the decoder input as decoder_x")
            memory = self.encode(x, padding_mask, attn_mask, segments)
            return self.decode(decoder_x, memory, padding_mask, decoder_padding_mask, return_layers=return_layers)
        if decoder_x is not None:
            raise ValueError(f"decoder_x is only used with arch='encoder_decoder', not {self.config.arch!r}")
        segments = self._check(x, padding_mask, attn_mask, segments)
        out, hidden = self.main(x, padding_mask, attn_mask, segments, return_layers, stop_early=stop_early)
        return (out, hidden) if return_layers is not None else out

    def encode(self, x, padding_mask=None, attn_mask=None, segments=None) -> torch.Tensor:
        if self.encoder is None:
            raise ValueError(f"arch={self.config.arch!r} has no encoder")
        segments = self._check(x, padding_mask, attn_mask, segments)
        return self.encoder(x, padding_mask, attn_mask, segments)[0]

    def decode(self, y, memory, memory_padding_mask=None, padding_mask=None, attn_mask=None, return_layers=None):
        if self.decoder is None:
            raise ValueError(f"arch={self.config.arch!r} has no decoder")
        self._check(y, padding_mask, attn_mask, None, name="decoder_x")
        if memory.dim() != 3 or memory.shape[0] != y.shape[0] or memory.shape[2] != self.dim:
            raise ValueError(f"memory: expected (B={y.shape[0]}, S, {self.dim}), got {tuple(memory.shape)}")
        out, hidden = self.decoder(y, padding_mask, attn_mask, None, return_layers, memory, memory_padding_mask)
        return (out, hidden) if return_layers is not None else out

    def _check(self, x, padding_mask, attn_mask, segments, name="x"):
        """Shape checks with messages that say what was expected."""
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"{name}: expected (B, T, {self.dim}) embeddings, got shape {tuple(x.shape)}")
        B, T, _ = x.shape
        if padding_mask is not None:
            if padding_mask.shape != (B, T):
                raise ValueError(f"padding_mask: expected shape (B, T) = {(B, T)}, got {tuple(padding_mask.shape)}")
            if padding_mask.dtype != torch.bool:
                raise ValueError(f"padding_mask: expected a bool tensor (True = padding), got {padding_mask.dtype}")
        if attn_mask is not None:
            ok = attn_mask.shape[-2:] == (T, T) and (
                attn_mask.dim() == 2 or (attn_mask.dim() == 3 and attn_mask.shape[0] == B)
                or (attn_mask.dim() == 4 and attn_mask.shape[0] in (1, B) and attn_mask.shape[1] in (1, self.config.heads))
            )
            if not ok:
                raise ValueError(
                    f"attn_mask: expected ({T}, {T}), ({B}, {T}, {T}) or ({B}, heads, {T}, {T}), "
                    f"got {tuple(attn_mask.shape)}"
                )
        experts = self.config.experts
        if not experts:
            # A plain backbone: every token takes the shared layers, whatever modality the
            # segments name. Heads always name their tokens' modality; the config decides
            # whether the backbone has experts for them (multiway) or shares everything.
            if segments is not None and sum(n for _, n in segments) != T:
                raise ValueError(f"segments: lengths {[n for _, n in segments]} add up to "
                                 f"{sum(n for _, n in segments)}, but T = {T}")
            return None
        if segments is None:
            raise ValueError(f"this backbone is multiway ({', '.join(experts)}): pass segments=[(expert, length), ...]")
        segments = merge_segments(segments)
        for e, n in segments:
            if e not in experts:
                raise ValueError(f"segments: unknown expert {e!r}; this backbone has {', '.join(experts)}")
            if n < 0:
                raise ValueError(f"segments: negative length {n} for {e!r}")
        if sum(n for _, n in segments) != T:
            raise ValueError(f"segments: lengths {[n for _, n in segments]} add up to {sum(n for _, n in segments)}, but T = {T}")
        return segments
