"""RNN-T loss through the joint network, whole or in memory-bounded sub-batches.

The joint network is ESPnet's ``JointNetwork`` (``lin_out(act(lin_enc(enc) + lin_dec(dec)))``).
Its output for a batch is a ``(B, T, U + 1, V)`` tensor: at LibriSpeech sizes (B = 32,
T = 400 frames of 40 ms, U = 80 units, V = 5000) that is 5 G floats, 20 GB, and the loss
keeps one more tensor of that size for backward (the logits on CPU, a gradient in torchaudio's
CUDA kernel). So the projections
``lin_enc(enc)`` (B, T, J) and ``lin_dec(dec)`` (B, U + 1, J) are computed once, and the
expensive part - broadcast sum, activation, ``lin_out``, loss - runs sub-batch by
sub-batch inside one autograd function that computes each sub-batch's gradients with
respect to the projections and ``lin_out`` right away and frees the rest. Peak memory is
that of one sub-batch; the gradients are those of the whole computation, up to rounding (a test
checks). NeMo's "fused" joint does the sub-batching too, but keeps every sub-batch's graph
until backward; here nothing of size T x U x V outlives its sub-batch.
"""
from __future__ import annotations

import math
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
    """RNN-T negative log-likelihood of (B, T, U + 1, V) logits (log-softmax fused in) for
    (B, U) targets: ``torchaudio.functional.rnnt_loss`` on CUDA, the vectorised lattice
    recursion below on CPU. ``reduction``: "sum", "mean" (over utterances) or "none"."""
    _check_lattice(logits, targets, logit_lengths, target_lengths)
    if logits.is_cuda:
        return torchaudio_rnnt_loss(logits, targets, logit_lengths, target_lengths, blank, reduction)
    x = logits if logits.dtype == torch.float64 else logits.float()
    nll = _LatticeLoss.apply(x, targets.long().clamp(0, x.shape[-1] - 1), logit_lengths.long(),
                             target_lengths.long(), blank)
    return {"sum": nll.sum, "mean": nll.mean, "none": lambda: nll}[reduction]()


def _check_lattice(logits, targets, logit_lengths, target_lengths) -> None:
    """One clear line for inconsistent inputs (an index past the lattice would otherwise fail
    deep inside, or a length of 0 read the lattice's last frame)."""
    if logits.dim() != 4 or targets.dim() != 2 or targets.shape != (logits.shape[0], logits.shape[2] - 1):
        raise ValueError(f"rnnt_loss: expected logits (B, T, U + 1, V) and targets (B, U), got "
                         f"{tuple(logits.shape)} and {tuple(targets.shape)}")
    B, T, U1 = logits.shape[:3]
    for name, lengths, low, high in (("logit_lengths", logit_lengths, 1, T),
                                     ("target_lengths", target_lengths, 0, U1 - 1)):
        if lengths.shape != (B,) or (B and (int(lengths.min()) < low or int(lengths.max()) > high)):
            raise ValueError(f"rnnt_loss: {name} must be {B} values in [{low}, {high}], got "
                             f"{lengths.tolist() if lengths.numel() <= 8 else tuple(lengths.shape)}")


def torchaudio_rnnt_loss(logits: torch.Tensor, targets: torch.Tensor, logit_lengths: torch.Tensor,
                         target_lengths: torch.Tensor, blank: int = BLANK, reduction: str = "sum") -> torch.Tensor:
    """``torchaudio.functional.rnnt_loss`` with the dtypes it wants: float32 logits, int32
    targets and lengths."""
    import torchaudio.functional as AF

    with warnings.catch_warnings():  # torchaudio 2.9 announces a deprecation it later withdrew
        warnings.simplefilter("ignore")
        return AF.rnnt_loss(logits.float(), targets.int(), logit_lengths.int(), target_lengths.int(),
                            blank=blank, reduction=reduction)


class _LatticeLoss(torch.autograd.Function):
    """-log P(y | x) per utterance from (B, T, U + 1, V) logits, log-softmax fused in: the
    forward-backward algorithm (Graves 2012) over the lattice's blank and label log-probs in
    float64, and the logits' gradient in closed form, softmax x (the probability of reaching the
    cell) minus the posterior of each transition taken from it.

    Written here because torchaudio's CPU kernel walks the lattice one utterance and one
    element at a time: at the tiny recipe's sizes (B ~12, T ~50, U ~17, V 81) it takes ~45 ms
    of a ~300 ms step; this takes ~12. Row t of alpha follows from row t - 1 in closed form,
    alpha(t, u) = E(t, u) + logcumsumexp_k<=u (alpha(t-1, k) + blank(t-1, k) - E(t, k)) with
    E(t, u) the label log-probs summed along row t up to u, so the loop runs over T only and
    never over U; beta likewise, backwards. Cells past an utterance's own (T, U) get no
    probability (beta -inf), hence no gradient. Only the logits and (B, T, U + 1) tensors are
    kept for backward, as torchaudio keeps one lattice-sized gradient.
    """

    @staticmethod
    def forward(ctx, x, labels, logit_lengths, target_lengths, blank):
        lse = torch.logsumexp(x, -1)
        b = (x[..., blank] - lse).double()
        e = (x[:, :, :-1].gather(-1, labels[:, None, :, None].expand(-1, x.shape[1], -1, 1)).squeeze(-1)
             - lse[:, :, :-1]).double()
        B, T, U1 = b.shape
        E = torch.cat([b.new_zeros(B, T, 1), e.cumsum(-1)], -1)
        alpha = torch.empty_like(b)
        alpha[:, 0] = E[:, 0]
        for t in range(1, T):
            alpha[:, t] = E[:, t] + torch.logcumsumexp(alpha[:, t - 1] + b[:, t - 1] - E[:, t], -1)
        rows, last_t = torch.arange(B), logit_lengths - 1
        ll = alpha[rows, last_t, target_lengths] + b[rows, last_t, target_lengths]
        # beta(t, u) = logaddexp(blank(t, u) + after(t, u), label(t, u) + beta(t, u + 1)), where
        # after(t) is beta(t + 1), or at an utterance's last frame the end state: 0 at its U only
        end = torch.full_like(b[:, 0], -math.inf)
        end[rows, target_lengths] = 0.0
        after = torch.full_like(b, -math.inf)
        beta = torch.empty_like(b)
        nxt = torch.full_like(end, -math.inf)
        for t in range(T - 1, -1, -1):
            nxt = torch.where((last_t == t)[:, None], end, nxt)
            after[:, t] = nxt
            c = b[:, t] + nxt + E[:, t]
            beta[:, t] = torch.logcumsumexp(c.flip(-1), -1).flip(-1) - E[:, t]
            nxt = beta[:, t]
        # posteriors of the transitions: a blank out of (t, u), a label out of (t, u)
        ll_ = ll[:, None, None]
        post_blank = torch.exp(alpha + b + after - ll_)
        post_label = torch.exp(alpha[:, :, :-1] + e + beta[:, :, 1:] - ll_)
        ctx.save_for_backward(x, lse, labels, post_blank.to(x.dtype), post_label.to(x.dtype))
        ctx.blank = blank
        return (-ll).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_nll):
        x, lse, labels, post_blank, post_label = ctx.saved_tensors
        occupancy = post_blank.clone()
        occupancy[:, :, :-1] += post_label
        grad = (x - lse[..., None]).exp_().mul_(occupancy[..., None])
        grad[..., ctx.blank] -= post_blank
        grad[:, :, :-1].scatter_add_(-1, labels[:, None, :, None].expand(-1, x.shape[1], -1, 1),
                                     -post_label[..., None])
        return grad.mul_(grad_nll[:, None, None, None]), None, None, None, None


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
