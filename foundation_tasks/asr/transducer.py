"""RNN-T loss through the joint network, whole or in memory-bounded sub-batches.

The joint network is ESPnet's ``JointNetwork`` (``lin_out(act(lin_enc(enc) + lin_dec(dec)))``).
Its output for a batch is a ``(B, T, U + 1, V)`` tensor: at LibriSpeech sizes (B = 32,
T = 400 frames of 40 ms, U = 80 units, V = 5000) that is 5 G floats, 20 GB, and
``torchaudio.functional.rnnt_loss`` keeps a gradient of the same size. So the projections
``lin_enc(enc)`` (B, T, J) and ``lin_dec(dec)`` (B, U + 1, J) are computed once, and the
expensive part - broadcast sum, activation, ``lin_out``, loss - runs sub-batch by
sub-batch inside one autograd function that computes each sub-batch's gradients with
respect to the projections and ``lin_out`` right away and frees the rest. Peak memory is
that of one sub-batch; the gradients are those of the whole computation, up to rounding (a test
checks). NeMo's "fused" joint does the sub-batching too, but keeps every sub-batch's graph
until backward; here nothing of size T x U x V outlives its sub-batch.
"""
from __future__ import annotations

import warnings
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

BLANK = 0  # ESPnet's convention: blank is id 0, and the predictor starts from it
# torchaudio's RNN-T kernel indexes the lattice with 32-bit integers: on CUDA a larger one is
# an illegal memory access (seen at B 32, T 400, U 80, V 5001: 5.2 G elements)
MAX_LATTICE = 2**31 - 1


def rnnt_loss(logits: torch.Tensor, targets: torch.Tensor, logit_lengths: torch.Tensor,
              target_lengths: torch.Tensor, blank: int = BLANK, reduction: str = "sum") -> torch.Tensor:
    """``torchaudio.functional.rnnt_loss`` (log-softmax fused in) with the dtypes it wants:
    float32 logits (B, T, U + 1, V), int32 targets (B, U) and lengths."""
    import torchaudio.functional as AF

    with warnings.catch_warnings():  # torchaudio 2.9 announces a deprecation it later withdrew
        warnings.simplefilter("ignore")
        return AF.rnnt_loss(logits.float(), targets.int(), logit_lengths.int(), target_lengths.int(),
                            blank=blank, reduction=reduction)


def joint_logits(enc_proj: torch.Tensor, dec_proj: torch.Tensor, activation: Callable,
                 weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """(B, T, J) and (B, U + 1, J) projections -> (B, T, U + 1, V) logits."""
    return F.linear(activation(enc_proj[:, :, None] + dec_proj[:, None]), weight, bias)


def _fitting(sub_batch: int, B: int, per_utterance: int) -> int:
    """``sub_batch`` made small enough that each sub-batch's lattice stays under
    ``MAX_LATTICE`` elements (0, the whole batch, where it already does)."""
    most = MAX_LATTICE // per_utterance
    if most < 1:
        raise ValueError(f"RNN-T lattice of one utterance is {per_utterance:,} elements (T x (U + 1) x V), over "
                         f"torchaudio's limit of {MAX_LATTICE:,}; shorten the utterances or the vocabulary")
    whole = sub_batch <= 0 or sub_batch >= B
    if whole and B <= most:
        return sub_batch
    return min(B if whole else sub_batch, most)


def _sub_batches(n: int, size: int) -> list[slice]:
    size = n if size <= 0 else size
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def _chunk_loss(enc, dec, weight, bias, targets, enc_lens, tgt_lens, activation, blank, s):
    """Loss (summed) of sub-batch ``s``, trimmed to its own longest T and U, in fp32 even
    under autocast (the loss wants fp32 logits, and the lattice is memory-bound anyway)."""
    T, U = int(enc_lens[s].max()), int(tgt_lens[s].max())
    with torch.autocast(enc.device.type, enabled=False):
        logits = joint_logits(enc[s, :T].float(), dec[s, :U + 1].float(), activation, weight.float(),
                              None if bias is None else bias.float())
        return rnnt_loss(logits, targets[s, :U], enc_lens[s], tgt_lens[s], blank)


class _SubBatchedJointLoss(torch.autograd.Function):
    """Forward computes the loss and, per sub-batch, the gradients; backward scales them."""

    @staticmethod
    def forward(ctx, enc, dec, weight, bias, targets, enc_lens, tgt_lens, activation, blank, sub_batch):
        inputs = (enc, dec, weight, bias)
        wanted = [t is not None and t.requires_grad for t in inputs]
        leaves = [None if t is None else t.detach().requires_grad_(w) for t, w in zip(inputs, wanted)]
        # gradients add up in fp32 whatever the inputs' dtype (bf16 under autocast)
        grads = [torch.zeros_like(t, dtype=torch.float32) if w else None for t, w in zip(inputs, wanted)]
        total = enc.new_zeros((), dtype=torch.float32)
        for s in _sub_batches(enc.shape[0], sub_batch):
            with torch.enable_grad():
                loss = _chunk_loss(*leaves, targets, enc_lens, tgt_lens, activation, blank, s)
                need = [t for t, w in zip(leaves, wanted) if w]
                got = iter(torch.autograd.grad(loss, need, allow_unused=True))
            for i, w in enumerate(wanted):
                if w:
                    g = next(got)
                    if g is not None:
                        grads[i] += g
            total += loss.detach()
        ctx.save_for_backward(*[g if g is not None else torch.empty(0) for g in grads])
        ctx.wanted, ctx.dtypes = wanted, [None if t is None else t.dtype for t in inputs]
        return total

    @staticmethod
    def backward(ctx, grad_out):
        out = [g.mul(grad_out.float()).to(dtype) if w else None
               for g, w, dtype in zip(ctx.saved_tensors, ctx.wanted, ctx.dtypes)]
        return (*out, None, None, None, None, None, None)


def transducer_loss(enc_proj: torch.Tensor, dec_proj: torch.Tensor, lin_out: nn.Linear, activation: Callable,
                    targets: torch.Tensor, enc_lens: torch.Tensor, tgt_lens: torch.Tensor, *,
                    sub_batch: int = 0, blank: int = BLANK, frozen_output: bool = False) -> torch.Tensor:
    """Summed RNN-T loss of ``lin_out(activation(enc_proj + dec_proj))``.

    ``sub_batch`` utterances at a time (0 = all at once, plain autograd); with
    ``frozen_output`` no gradient reaches ``lin_out`` (the auxiliary transducer loss).
    Both paths give the same value and gradients.
    """
    weight, bias = lin_out.weight, lin_out.bias
    if frozen_output:
        weight, bias = weight.detach(), None if bias is None else bias.detach()
    sub_batch = _fitting(sub_batch, enc_proj.shape[0], enc_proj.shape[1] * dec_proj.shape[1] * weight.shape[0])
    if sub_batch <= 0 or sub_batch >= enc_proj.shape[0]:
        return _chunk_loss(enc_proj, dec_proj, weight, bias, targets, enc_lens, tgt_lens, activation, blank,
                           slice(None))
    if not torch.is_grad_enabled():
        total = enc_proj.new_zeros((), dtype=torch.float32)
        for s in _sub_batches(enc_proj.shape[0], sub_batch):
            total += _chunk_loss(enc_proj, dec_proj, weight, bias, targets, enc_lens, tgt_lens, activation, blank, s)
        return total
    return _SubBatchedJointLoss.apply(enc_proj, dec_proj, weight, bias, targets, enc_lens, tgt_lens,
                                      activation, blank, sub_batch)
