"""Attention, feed-forward and relative position bias: the pieces a block is made of."""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from foundation.multiway import Segments, per_expert, route

ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU, "swish": nn.SiLU}


def fused_linear(dim: int, n: int, bias: bool) -> nn.Linear:
    """``n`` stacked D x D projections in one Linear; ``fused`` tells the init to treat
    each slice as its own D x D matrix."""
    linear = nn.Linear(dim, n * dim, bias=bias)
    linear.fused = n
    return linear


class _Heads(nn.Module):
    """Multi-head scaled dot-product attention on ``F.scaled_dot_product_attention``; the
    projections around it are the subclasses'."""

    # the stability guard's attention rule (engine/guard.py, AttentionWatch) sees each (q, k) here:
    # the fused kernel never forms the logits q.k it judges
    logit_watch = None

    def __init__(self, dim: int, heads: int, attn_dropout: float):
        super().__init__()
        self.heads, self.head_dim, self.attn_dropout = heads, dim // heads, attn_dropout

    def _heads(self, t: torch.Tensor, n: int) -> list[torch.Tensor]:
        # (B, T, n*D) -> n tensors of (B, H, T, hd); unbind before transposing saves a
        # (B, T, n*D) copy in backward
        B, T, _ = t.shape
        return [u.transpose(1, 2) for u in t.view(B, T, n, self.heads, self.head_dim).unbind(2)]

    def _attend(self, q, k, v, mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
        """(B, H, T, hd) queries -> (B, T, D). The fused kernels keep the softmax in fp32
        under bf16 autocast."""
        B, H, T, hd = q.shape
        if self.logit_watch is not None:
            self.logit_watch(q, k)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal,
            dropout_p=self.attn_dropout if self.training else 0.0,
        )
        return out.transpose(1, 2).reshape(B, T, H * hd)


class Attention(_Heads):
    """Self-attention with one fused ``qkv`` projection (rows: q, k, v - timm's layout),
    per expert when multiway. ``sub_ln`` adds Magneto's LayerNorm before the output
    projection (eq. 2)."""

    def __init__(
        self,
        dim: int,
        heads: int,
        *,
        experts: Sequence[str] = (),
        qkv_bias: bool = True,
        sub_ln: bool = False,
        eps: float = 1e-5,
        attn_dropout: float = 0.0,
        dropout: float = 0.0,
    ):
        super().__init__(dim, heads, attn_dropout)
        self.qkv = per_expert(experts, lambda: fused_linear(dim, 3, qkv_bias))
        self.norm = per_expert(experts, lambda: nn.LayerNorm(dim, eps=eps)) if sub_ln else None
        self.proj = per_expert(experts, lambda: nn.Linear(dim, dim))
        self.proj_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, segments: Segments | None = None, mask: torch.Tensor | None = None,
                is_causal: bool = False) -> torch.Tensor:
        q, k, v = self._heads(route(self.qkv, x, segments), 3)
        out = self._attend(q, k, v, mask, is_causal)
        if self.norm is not None:
            out = route(self.norm, out, segments)
        return self.proj_drop(route(self.proj, out, segments))


class CrossAttention(_Heads):
    """Queries from ``x``, keys and values (one fused ``kv``) from ``memory``, the encoder's
    output. No Sub-LN: Magneto keeps only the cross-attention's input LayerNorm."""

    def __init__(self, dim: int, heads: int, *, qkv_bias: bool = True, attn_dropout: float = 0.0,
                 dropout: float = 0.0):
        super().__init__(dim, heads, attn_dropout)
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = fused_linear(dim, 2, qkv_bias)
        self.norm = None  # no Sub-LN, whatever the rule
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        (q,) = self._heads(self.q(x), 1)
        k, v = self._heads(self.kv(memory), 2)
        return self.proj_drop(self.proj(self._attend(q, k, v, mask, False)))


class FeedForward(nn.Module):
    """fc1 -> activation -> [Sub-LN] -> fc2 (Magneto eqs. 3-5; timm's ``Mlp`` names)."""

    def __init__(
        self,
        dim: int,
        ffn_dim: int,
        *,
        activation: str = "gelu",
        sub_ln: bool = False,
        eps: float = 1e-5,
        activation_dropout: float = 0.0,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.fc1 = nn.Linear(dim, ffn_dim)
        self.act = ACTIVATIONS[activation]()
        self.act_drop = nn.Dropout(activation_dropout)
        self.norm = nn.LayerNorm(ffn_dim, eps=eps) if sub_ln else None
        self.fc2 = nn.Linear(ffn_dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act_drop(self.act(self.fc1(x)))
        if self.norm is not None:
            x = self.norm(x)
        return self.drop(self.fc2(x))


def relative_position_bucket(rel: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Bidirectional log-bucketing of key-minus-query offsets (T5; torchscale's
    ``RelativePositionBias``): half the buckets per direction, exact up to a quarter of
    ``num_buckets``, logarithmic up to ``max_distance``, clamped beyond."""
    half = num_buckets // 2
    bucket = (rel > 0).long() * half  # keys after the query use the upper half
    dist = rel.abs()
    exact = half // 2
    log_part = exact + (
        torch.log(dist.float().clamp(min=1) / exact) / math.log(max_distance / exact) * (half - exact)
    ).long()
    log_part = log_part.clamp(max=half - 1)
    return bucket + torch.where(dist < exact, dist, log_part)


class RelativePositionBias1d(nn.Module):
    """Per-head bias from bucketed 1-D offsets, shared by all layers (speech, text)."""

    def __init__(self, heads: int, num_buckets: int = 32, max_distance: int = 128):
        super().__init__()
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.table = nn.Parameter(torch.zeros(num_buckets, heads))
        nn.init.normal_(self.table)  # as nn.Embedding, which torchscale uses

    def forward(self, T: int, S: int | None = None) -> torch.Tensor:
        S = T if S is None else S
        pos = torch.arange(max(T, S), device=self.table.device)
        rel = pos[None, :S] - pos[:T, None]
        idx = relative_position_bucket(rel, self.num_buckets, self.max_distance)
        return self.table[idx].permute(2, 0, 1).unsqueeze(0)  # (1, H, T, S)


class RelativePositionBias2d(nn.Module):
    """BEiT's relative position bias over a patch grid, plus the class-token entries.

    The table has (2h-1)(2w-1) grid offsets and three extra rows: class->patch,
    patch->class and class->class, as in BEiT / BEiT v2 / mmseg's BEiT.
    """

    def __init__(self, heads: int, grid: Sequence[int], prefix: int = 1):
        super().__init__()
        if prefix not in (0, 1):
            raise ValueError(f"rel_pos='2d' supports 0 or 1 prefix (class) tokens, got {prefix}")
        h, w = grid
        self.grid, self.prefix = (h, w), prefix
        n_rel = (2 * h - 1) * (2 * w - 1)
        self.table = nn.Parameter(torch.zeros(n_rel + 3, heads))
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        coords = torch.stack([ys.flatten(), xs.flatten()])  # (2, h*w)
        d = coords[:, :, None] - coords[:, None, :]  # query minus key
        grid_idx = (d[0] + h - 1) * (2 * w - 1) + (d[1] + w - 1)
        n = h * w + prefix
        index = torch.zeros(n, n, dtype=torch.long)
        index[prefix:, prefix:] = grid_idx
        if prefix:
            index[0, 1:], index[1:, 0], index[0, 0] = n_rel, n_rel + 1, n_rel + 2
        self.register_buffer("index", index, persistent=False)

    @property
    def num_tokens(self) -> int:
        return self.index.shape[0]

    def forward(self, T: int, S: int | None = None) -> torch.Tensor:
        if T != self.num_tokens or (S is not None and S != T):
            h, w = self.grid
            raise ValueError(
                f"rel_pos='2d' was built for {self.prefix} prefix token(s) + a {h}x{w} patch "
                f"grid = {self.num_tokens} tokens, got a sequence of {T}; set rel_pos_grid for "
                "this resolution (and interpolate the table when loading a checkpoint)"
            )
        return self.table[self.index].permute(2, 0, 1).unsqueeze(0)  # (1, H, T, T)


def attention_mask(
    B: int,
    T: int,
    S: int,
    *,
    padding_mask: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    causal: bool = False,
    dtype: torch.dtype = torch.float32,
    device: torch.device | None = None,
) -> tuple[torch.Tensor | None, bool]:
    """Combine padding, user mask, causality and position bias into SDPA's ``attn_mask``.

    Built once per forward and shared by all layers. Returns ``(mask, is_causal)``:
    ``(None, causal)`` when only causality applies (the fused kernels' fast path), a bool
    mask (True = may attend) when nothing is additive, else an additive float mask.
    ``padding_mask``: (B, S), True = padding. ``attn_mask``: bool (True = masked out, as in
    nn.MultiheadAttention and torchscale) or additive float, shape (T, S), (B, T, S) or
    (B, H, T, S).
    """
    blocked = None
    if padding_mask is not None:
        blocked = padding_mask[:, None, None, :]
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        m = attn_mask if attn_mask.dim() == 4 else attn_mask.view(-1, 1, T, S)
        blocked = m if blocked is None else blocked | m
        attn_mask = None
    if causal and (blocked is not None or attn_mask is not None or bias is not None):
        upper = torch.ones(T, S, dtype=torch.bool, device=device).triu(S - T + 1)
        blocked = upper if blocked is None else blocked | upper
        causal = False
    if attn_mask is None and bias is None:
        return (None if blocked is None else ~blocked), causal
    add = torch.zeros((), dtype=dtype, device=device)
    if bias is not None:
        add = add + bias
    if attn_mask is not None:
        add = add + (attn_mask if attn_mask.dim() == 4 else attn_mask.view(-1, 1, T, S))
    if blocked is not None:
        add = add.masked_fill(blocked, float("-inf"))
    return _aligned(add.to(dtype)), causal


def _aligned(mask: torch.Tensor) -> torch.Tensor:
    """The same values with the last dimension's rows starting at multiples of 16 elements:
    the memory-efficient SDPA kernel wants an aligned bias and otherwise pads it itself, in
    every layer; the mask is built once per forward and shared by all of them."""
    S = mask.shape[-1]
    if S % 16 == 0 or all(st == 0 for st in mask.stride()[:-1]):
        return mask
    return F.pad(mask, (0, -S % 16))[..., :S]


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype attention runs in: autocast's when it is on for ``x``'s device (the
    projections then return it), else ``x``'s. An additive mask in that dtype is one the
    fused kernels take as it is."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
