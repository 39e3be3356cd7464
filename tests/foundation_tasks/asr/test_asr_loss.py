"""RNN-T loss: ours (CPU) and torchaudio's (CUDA) against a log-space reference and brute force,
and the sub-batched joint."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from foundation_tasks.asr.transducer import joint_logits, rnnt_loss, torchaudio_rnnt_loss, transducer_loss


def rnnt_loss_reference(logits, targets, logit_lengths, target_lengths, blank=0):
    """Per-utterance RNN-T negative log-likelihood, the forward algorithm in log space
    (Graves 2012, eq. 16): alpha(t, u) = logaddexp(alpha(t-1, u) + blank(t-1, u),
    alpha(t, u-1) + y(t, u-1)); loss = -(alpha(T-1, U) + blank(T-1, U))."""
    logp = logits.log_softmax(-1)
    losses = []
    for b in range(logits.shape[0]):
        T, U = int(logit_lengths[b]), int(target_lengths[b])
        y = targets[b, :U].long()
        alpha = [[None] * (U + 1) for _ in range(T)]
        for t in range(T):
            for u in range(U + 1):
                terms = []
                if t == 0 and u == 0:
                    terms.append(logp.new_zeros(()))
                if t > 0:
                    terms.append(alpha[t - 1][u] + logp[b, t - 1, u, blank])
                if u > 0:
                    terms.append(alpha[t][u - 1] + logp[b, t, u - 1, y[u - 1]])
                alpha[t][u] = torch.logsumexp(torch.stack(terms), 0)
        losses.append(-(alpha[T - 1][U] + logp[b, T - 1, U, blank]))
    return torch.stack(losses)


def rnnt_loss_brute_force(logits, target, T, U, blank=0):
    """-log of the sum over every alignment: T blanks and U labels in any order, the last
    step a blank; a label keeps t and moves u, a blank moves t."""
    logp = logits.log_softmax(-1)
    scores = []
    for label_steps in itertools.combinations(range(T + U - 1), U):
        t = u = 0
        s = 0.0
        for step in range(T + U):
            if step in label_steps:
                s = s + logp[t, u, target[u]]
                u += 1
            else:
                s = s + logp[t, u, blank]
                t += 1
        assert (t, u) == (T, U)
        scores.append(s)
    assert len(scores) == math.comb(T + U - 1, U)
    return -torch.logsumexp(torch.stack(scores), 0)


def _random_batch(B=3, T=6, U=4, V=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, U + 1, V, generator=g, dtype=torch.float64)
    targets = torch.randint(1, V, (B, U), generator=g, dtype=torch.int32)
    logit_lengths = torch.tensor([T, T - 1, T - 2][:B], dtype=torch.int32)
    target_lengths = torch.tensor([U, U - 2, U - 1][:B], dtype=torch.int32)
    return logits, targets, logit_lengths, target_lengths


def test_reference_matches_brute_force():
    logits, targets, T, U = _random_batch(B=1, T=4, U=3, V=4)
    ref = rnnt_loss_reference(logits, targets, T, U)[0]
    brute = rnnt_loss_brute_force(logits[0], targets[0].long(), 4, 3)
    assert torch.allclose(ref, brute, atol=1e-10)


@pytest.mark.parametrize("loss_fn", [rnnt_loss, torchaudio_rnnt_loss], ids=["lattice", "torchaudio"])
def test_rnnt_loss_matches_reference_loss_and_gradients(loss_fn):
    """Both implementations: ours (the CPU path) and torchaudio's (the CUDA path)."""
    logits, targets, T, U = _random_batch()
    ours = logits.float().clone().requires_grad_()
    ref_in = logits.clone().requires_grad_()
    loss = loss_fn(ours, targets, T, U, reduction="sum")
    ref = rnnt_loss_reference(ref_in, targets, T, U).sum()
    loss.backward()
    ref.backward()
    assert torch.allclose(loss.double(), ref, rtol=1e-5)
    assert torch.allclose(ours.grad.double(), ref_in.grad, atol=1e-5)
    one = _random_batch(B=1, T=3, U=2, V=3, seed=1)
    brute = rnnt_loss_brute_force(one[0][0], one[1][0].long(), 3, 2)
    assert torch.allclose(loss_fn(one[0], one[1], one[2], one[3]).double(), brute, rtol=1e-5)


def test_lattice_loss_gradcheck_and_edge_lengths():
    """float64 gradients against finite differences, with an utterance of one frame, one with no
    labels and padding in both axes; the reductions as torchaudio's."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 5, 4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(1, 6, (4, 3), generator=g)
    T, U = torch.tensor([5, 1, 3, 4]), torch.tensor([3, 2, 0, 1])
    assert torch.autograd.gradcheck(lambda x: rnnt_loss(x, targets, T, U, reduction="none"), (logits,))
    per = rnnt_loss_reference(logits, targets, T, U)
    assert torch.allclose(rnnt_loss(logits, targets, T, U, reduction="none"), per, rtol=1e-10)
    assert torch.allclose(rnnt_loss(logits, targets, T, U, reduction="mean"), per.mean(), rtol=1e-10)
    # no probability (and no gradient) reaches the cells past an utterance's own T and U
    grad, = torch.autograd.grad(rnnt_loss(logits, targets, T, U), logits)
    assert grad[1, 1:].abs().sum() == 0 and grad[2, :, 1:].abs().sum() == 0 and grad[3, 4:].abs().sum() == 0


@pytest.mark.parametrize("T, U, match", [([6, 5], [3, 2], "logit_lengths"), ([0, 5], [3, 2], "logit_lengths"),
                                         ([5, 5], [4, 2], "target_lengths")])
def test_inconsistent_lengths_are_one_clear_error(T, U, match):
    x, targets = torch.randn(2, 5, 4, 6), torch.randint(1, 6, (2, 3))
    with pytest.raises(ValueError, match=match):
        rnnt_loss(x, targets, torch.tensor(T), torch.tensor(U))
    with pytest.raises(ValueError, match="targets"):
        rnnt_loss(x, targets[:, :2], torch.tensor([5, 5]), torch.tensor([2, 2]))


def test_lattice_loss_agrees_with_torchaudio_at_the_recipes_size():
    """The tiny ASR recipe's lattice (B 12, T 48, U 16, V 81): ours runs the recursion in
    float64, so against a float64 reference it is closer than torchaudio's float32 kernel."""
    g = torch.Generator().manual_seed(0)
    B, T, U, V = 12, 48, 16, 81
    logits = 3 * torch.randn(B, T, U + 1, V, generator=g)
    targets = torch.randint(1, V, (B, U), generator=g)
    T_lens = torch.randint(T // 2, T + 1, (B,), generator=g).clamp(min=U)
    U_lens = torch.randint(0, U + 1, (B,), generator=g)
    T_lens[0], U_lens[0] = T, U
    exact = logits.double().requires_grad_()
    ref = rnnt_loss(exact, targets, T_lens, U_lens, reduction="none")
    ref_grad, = torch.autograd.grad(ref.sum(), exact)
    errors = {}
    for name, fn in (("lattice", rnnt_loss), ("torchaudio", torchaudio_rnnt_loss)):
        x = logits.clone().requires_grad_()
        loss = fn(x, targets, T_lens, U_lens, reduction="none")
        grad, = torch.autograd.grad(loss.sum(), x)
        assert torch.allclose(loss.double(), ref, rtol=1e-5)
        errors[name] = (grad.double() - ref_grad).abs().max().item()
    assert errors["torchaudio"] < 1e-3 and errors["lattice"] < 1e-5


def _joint_case(seed=0, B=5, T=9, U=4, J=8, V=7):
    g = torch.Generator().manual_seed(seed)
    enc = torch.randn(B, T, J, generator=g, requires_grad=True)
    dec = torch.randn(B, U + 1, J, generator=g, requires_grad=True)
    lin_out = torch.nn.Linear(J, V)
    targets = torch.randint(1, V, (B, U), generator=g)
    enc_lens = torch.tensor([9, 7, 9, 3, 5])[:B]
    tgt_lens = torch.tensor([4, 2, 3, 1, 0])[:B]
    return enc, dec, lin_out, targets, enc_lens, tgt_lens


@pytest.mark.parametrize("sub_batch", [1, 2, 3])
@pytest.mark.parametrize("frozen_output", [False, True])
def test_sub_batched_joint_equals_full(sub_batch, frozen_output):
    enc, dec, lin_out, targets, enc_lens, tgt_lens = _joint_case()
    results = []
    for sb in (0, sub_batch):
        for t in (enc, dec, *lin_out.parameters()):
            t.grad = None
        # an upstream op, so that the gradients also flow on through the function
        loss = transducer_loss(enc * 1.5, dec * 0.5, lin_out, torch.tanh, targets, enc_lens, tgt_lens,
                               sub_batch=sb, frozen_output=frozen_output)
        (loss * 0.7).backward()
        results.append((loss.detach(), enc.grad.clone(), dec.grad.clone(),
                        None if lin_out.weight.grad is None else lin_out.weight.grad.clone(),
                        None if lin_out.bias.grad is None else lin_out.bias.grad.clone()))
    full, sub = results
    assert torch.allclose(full[0], sub[0], rtol=1e-5)
    for a, b in zip(full[1:], sub[1:]):
        if frozen_output and a is None:
            assert b is None
            continue
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    if frozen_output:
        assert full[3] is None and sub[3] is None


def test_a_lattice_over_the_kernel_limit_is_split_into_sub_batches(monkeypatch):
    """torchaudio's kernel indexes the (B, T, U + 1, V) lattice with int32 (on CUDA, a larger
    one is an illegal memory access): the whole-batch request is split so that each part
    stays under the limit, with the same loss; one utterance over it is a clear error."""
    from foundation_tasks.asr import transducer

    enc, dec, lin_out, targets, enc_lens, tgt_lens = _joint_case()
    whole = transducer_loss(enc, dec, lin_out, torch.tanh, targets, enc_lens, tgt_lens)
    per_utterance = enc.shape[1] * dec.shape[1] * lin_out.out_features
    calls = []
    real = transducer._chunk_loss
    monkeypatch.setattr(transducer, "_chunk_loss", lambda *a: calls.append(a[-1]) or real(*a))
    monkeypatch.setattr(transducer, "MAX_LATTICE", 2 * per_utterance)
    split = transducer_loss(enc, dec, lin_out, torch.tanh, targets, enc_lens, tgt_lens)
    assert torch.allclose(split, whole, rtol=1e-5)
    assert calls and all(s.stop - s.start <= 2 for s in calls)
    monkeypatch.setattr(transducer, "MAX_LATTICE", per_utterance - 1)
    with pytest.raises(ValueError, match="over torchaudio's limit"):
        transducer_loss(enc, dec, lin_out, torch.tanh, targets, enc_lens, tgt_lens)


def test_joint_logits_shape_and_no_grad_path():
    enc, dec, lin_out, targets, enc_lens, tgt_lens = _joint_case()
    assert joint_logits(enc, dec, torch.tanh, lin_out.weight, lin_out.bias).shape == (5, 9, 5, 7)
    with torch.no_grad():
        a = transducer_loss(enc, dec, lin_out, torch.tanh, targets, enc_lens, tgt_lens, sub_batch=2)
        b = transducer_loss(enc, dec, lin_out, torch.tanh, targets, enc_lens, tgt_lens, sub_batch=0)
    assert torch.allclose(a, b, rtol=1e-5)


def test_sub_batched_joint_under_bf16_autocast_is_fp32_inside():
    """Projections come out of autocast in bf16; the lattice and the loss run in fp32, and
    the gradients come back in the inputs' dtype."""
    enc, dec, lin_out, targets, enc_lens, tgt_lens = _joint_case()
    enc16 = enc.detach().bfloat16().requires_grad_()
    dec16 = dec.detach().bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = transducer_loss(enc16, dec16, lin_out, torch.tanh, targets, enc_lens, tgt_lens, sub_batch=2)
    loss.backward()
    ref = transducer_loss(enc16.detach().float(), dec16.detach().float(), lin_out, torch.tanh, targets, enc_lens,
                          tgt_lens, sub_batch=0)
    assert loss.dtype == torch.float32 and torch.allclose(loss, ref, rtol=1e-5)
    assert enc16.grad.dtype == torch.bfloat16 and dec16.grad.dtype == torch.bfloat16


@pytest.mark.slow  # two fresh Python processes importing torch: slow on a busy machine
def test_joint_benchmark_runs_at_toy_size(tmp_path, capsys):
    """benchmarks/bench_rnnt_joint.py: every variant in its own process (ours and torchaudio's
    kernel on the whole lattice), the same loss, and
    the sub-batched variants keep only (B, T, J)-sized gradients for backward."""
    import json

    from support import load_benchmark

    bench = load_benchmark("bench_rnnt_joint")
    out = tmp_path / "rows.json"
    args = ["--batch", "4", "--frames", "30", "--units", "6", "--vocab", "301", "--joint-dim", "16",
            "--sub-batch", "1", "--json", str(out)]
    assert bench.main(args) == 0
    rows = {r["variant"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"full", "full, torchaudio", "sub=1"}
    for other in ("sub=1", "full, torchaudio"):
        assert abs(rows["full"]["loss"] - rows[other]["loss"]) < 1e-5 * abs(rows["full"]["loss"])
    lattice = 4 * 30 * 7 * 301 * 4
    assert rows["full"]["saved_bytes"] >= lattice > 10 * rows["sub=1"]["saved_bytes"]
    assert "| full |" in capsys.readouterr().out
