"""One Transformer layer. It reads its ``NormRule`` (``foundation.scaling.RULES``, where each
of preln, postln, magneto and deepnorm is described once): ``Block.residual`` applies the
rule's residual, ``init_block`` its init."""
from __future__ import annotations

import torch
from timm.layers import DropPath, LayerScale
from torch import nn

from foundation.config import BackboneConfig
from foundation.layers import Attention, CrossAttention, FeedForward
from foundation.multiway import Multiway, Segments, per_expert, route
from foundation.scaling import NormRule


class Block(nn.Module):
    def __init__(
        self,
        cfg: BackboneConfig,
        rule: NormRule,
        *,
        cross: bool = False,
        drop_path: float = 0.0,
        vl_expert: bool = False,
    ):
        super().__init__()
        self.rule = rule
        experts = list(cfg.experts)
        ffn_experts = experts + ["vl"] if vl_expert else experts
        norm = lambda: nn.LayerNorm(cfg.dim, eps=cfg.layernorm_eps)  # noqa: E731
        scale = lambda: LayerScale(cfg.dim, cfg.layer_scale) if cfg.layer_scale else nn.Identity()  # noqa: E731

        attn_experts = [] if cfg.shared_attention else experts
        self.norm1 = per_expert(attn_experts, norm)
        self.attn = Attention(
            cfg.dim, cfg.heads, experts=attn_experts, qkv_bias=cfg.qkv_bias, sub_ln=rule.sub_ln,
            eps=cfg.layernorm_eps, attn_dropout=cfg.attn_dropout, dropout=cfg.dropout,
        )
        self.ls1 = scale()
        if cross:  # Magneto: the cross-attention keeps only its input LayerNorm (no Sub-LN)
            self.norm_cross = norm()
            self.cross_attn = CrossAttention(
                cfg.dim, cfg.heads, qkv_bias=cfg.qkv_bias, attn_dropout=cfg.attn_dropout, dropout=cfg.dropout,
            )
            self.ls_cross = scale()
        else:
            self.cross_attn = None
        self.norm2 = per_expert(ffn_experts, norm)
        self.mlp = per_expert(ffn_experts, lambda: FeedForward(
            cfg.dim, cfg.ffn_dim, activation=cfg.activation, sub_ln=rule.sub_ln, eps=cfg.layernorm_eps,
            activation_dropout=cfg.activation_dropout, dropout=cfg.dropout,
        ))
        self.ls2 = scale()
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.vl_expert = vl_expert

    def residual(self, x, branch, norm, segments):
        """preln / magneto: x + f(LN(x))      (Magneto eqs. 1-5: LN inside f for magneto)
        postln / deepnorm: LN(alpha x + f(x))  (DeepNet eq. 1; alpha = 1 for postln)"""
        alpha = self.rule.alpha
        shortcut = x if alpha == 1.0 else alpha * x
        if self.rule.pre_norm:
            return shortcut + self.drop_path(branch(route(norm, x, segments)))
        return route(norm, shortcut + self.drop_path(branch(x)), segments)

    def forward(
        self,
        x: torch.Tensor,
        segments: Segments | None = None,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        memory: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = self.residual(x, lambda h: self.ls1(self.attn(h, segments, mask, is_causal)), self.norm1, segments)
        if self.cross_attn is not None:
            x = self.residual(
                x, lambda h: self.ls_cross(self.cross_attn(h, memory, memory_mask)),
                self.norm_cross, None,
            )
        ffn_segments = segments
        if self.vl_expert and len({name for name, _ in segments}) > 1:
            ffn_segments = [("vl", x.shape[1])]  # BEiT-3: mixed input uses the shared expert on top
        return self.residual(x, lambda h: self.ls2(route(self.mlp, h, ffn_segments)), self.norm2, ffn_segments)


def _experts(module: nn.Module) -> list[nn.Module]:
    return list(module.values()) if isinstance(module, Multiway) else [module]


@torch.no_grad()
def init_block(block: Block, *, variant: str = "paper") -> None:
    """Standard init, then W_v, W_o, W_1, W_2 times the rule's ``gain`` (W_q, W_k untouched).

    paper:      Xavier-normal weights, zero biases (Magneto Fig. 2's ``subln_init``).
    torchscale: PyTorch's default Linear init, and the biases are scaled too, as
                torchscale 0.3.0 does (it scales every parameter whose name matches).
    Cross-attention is scaled when the rule says so (``NormRule.scale_cross``).
    """
    for m in block.modules():
        if isinstance(m, nn.Linear):
            if variant == "torchscale":
                m.reset_parameters()
            else:
                # per D x D slice, so a fused qkv gets each projection's own Xavier std
                for w in m.weight.chunk(getattr(m, "fused", 1), dim=0):
                    nn.init.xavier_normal_(w)
                if m.bias is not None:
                    m.bias.zero_()
        elif isinstance(m, nn.LayerNorm):
            m.reset_parameters()
    gain = block.rule.gain
    if gain == 1.0:
        return
    scale_bias = variant == "torchscale"

    def scale(linear: nn.Linear, rows: slice = slice(None)) -> None:
        linear.weight[rows] *= gain
        if scale_bias and linear.bias is not None:
            linear.bias[rows] *= gain

    dim = block.attn.proj.in_features if isinstance(block.attn.proj, nn.Linear) else \
        next(iter(block.attn.proj.values())).in_features
    for qkv in _experts(block.attn.qkv):
        scale(qkv, slice(2 * dim, 3 * dim))  # the v rows of the fused projection
    for proj in _experts(block.attn.proj):
        scale(proj)
    for mlp in _experts(block.mlp):
        scale(mlp.fc1)
        scale(mlp.fc2)
    if block.cross_attn is not None and block.rule.scale_cross:
        scale(block.cross_attn.kv, slice(dim, 2 * dim))
        scale(block.cross_attn.proj)
