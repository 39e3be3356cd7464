"""Peak memory and time of the RNN-T joint network + loss: whole batch vs sub-batches.

    python benchmarks/bench_rnnt_joint.py                       # B=8, T=250, U=50, V=5001, J=512 on CPU
    python benchmarks/bench_rnnt_joint.py --device cuda --batch 32 --frames 400 --units 80

Each variant runs forward + backward once in a fresh process, so that its peak is its own:

* ``full``: ``lin_out(tanh(enc + dec))`` for the whole (B, T, U + 1, V) lattice, then the RNN-T
  loss (plain autograd); a lattice over torchaudio's int32 limit (2^31 elements) is split
  anyway, and the row says into what;
* ``full, torchaudio``: the same with ``torchaudio.functional.rnnt_loss`` on CPU too (our CPU
  path is the vectorised lattice recursion of ``foundation_tasks.asr.transducer``);
* ``sub=k``: ``foundation_tasks.asr.transducer.transducer_loss(..., sub_batch=k)``: the same loss and
  gradients, k utterances of the lattice at a time.

Memory is reported two ways: ``peak`` (CPU: growth of the process's peak resident set,
``ru_maxrss``, over the resident set once the inputs exist; CUDA: ``max_memory_allocated``
over what was allocated before) and ``saved for backward`` (the distinct storages autograd
still holds between forward and backward, counted with ``saved_tensors_hooks``); the size
of one fp32 (B, T, U + 1, V) lattice is printed for scale. Time is one forward + backward.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Saved:
    """A tensor autograd keeps for backward; counts the distinct storages still alive
    (a sub-batch's own graph is gone when its gradients are taken)."""

    live: dict[int, tuple[int, int]] = {}  # id(self) -> (storage pointer, bytes)

    def __init__(self, tensor):
        self.tensor = tensor
        storage = tensor.untyped_storage()
        _Saved.live[id(self)] = (storage.data_ptr(), storage.nbytes())

    def __del__(self):
        _Saved.live.pop(id(self), None)

    @staticmethod
    def live_bytes() -> int:
        return sum(dict(_Saved.live.values()).values())


def run_variant(a: argparse.Namespace, sub_batch: int, kernel: str = "ours") -> dict:
    """Forward + backward of one variant in this process; returns its measurements."""
    import torch

    from foundation_tasks.asr import transducer
    from foundation_tasks.asr.transducer import _fitting, transducer_loss

    if kernel == "torchaudio":
        transducer.rnnt_loss = transducer.torchaudio_rnnt_loss

    torch.manual_seed(0)
    device = torch.device(a.device)
    B, T, U, V, J = a.batch, a.frames, a.units, a.vocab, a.joint_dim
    enc = torch.randn(B, T, J, device=device, requires_grad=True)
    dec = torch.randn(B, U + 1, J, device=device, requires_grad=True)
    lin_out = torch.nn.Linear(J, V).to(device)
    targets = torch.randint(1, V, (B, U), device=device)
    # realistic padding: lengths spread from 60 % to 100 % of the longest
    frac = torch.linspace(0.6, 1.0, B, device=device)
    enc_lens = (frac * T).long().clamp(min=1)
    tgt_lens = (frac * U).long().clamp(min=1)
    enc_lens[-1], tgt_lens[-1] = T, U
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_bytes()
    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(_Saved, lambda packed: packed.tensor):
        loss = transducer_loss(enc, dec, lin_out, torch.tanh, targets, enc_lens, tgt_lens, sub_batch=sub_batch)
    saved_bytes = _Saved.live_bytes()
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    seconds = time.perf_counter() - start
    used = _fitting(sub_batch, B, T * (U + 1) * V)
    variant = "full" if used <= 0 else f"sub={used}"
    if kernel != "ours":
        variant += f", {kernel}"
    if used != sub_batch:
        variant += f" (asked {'full' if sub_batch <= 0 else sub_batch}; int32 lattice limit)"
    return {"variant": variant, "loss": float(loss),
            "peak_bytes": peak, "saved_bytes": saved_bytes, "seconds": seconds,
            "grad_norm": float(enc.grad.norm() + dec.grad.norm() + lin_out.weight.grad.norm())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--frames", type=int, default=250, help="encoder frames T (40 ms: 250 = 10 s)")
    p.add_argument("--units", type=int, default=50, help="target units U")
    p.add_argument("--vocab", type=int, default=5001, help="output units V (5000 sentencepiece + blank)")
    p.add_argument("--joint-dim", type=int, default=512)
    p.add_argument("--sub-batch", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path, help="also write the rows here")
    p.add_argument("--no-torchaudio", action="store_true", help="skip the whole lattice through torchaudio's kernel")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker is not None:
        sub, kernel = a.worker.split(":")
        print(json.dumps(run_variant(a, int(sub), kernel)))
        return 0
    lattice = a.batch * a.frames * (a.units + 1) * a.vocab * 4
    print(f"B={a.batch} T={a.frames} U={a.units} V={a.vocab} J={a.joint_dim} on {a.device}; "
          f"one fp32 (B, T, U+1, V) lattice = {lattice / 2**20:,.0f} MiB; "
          f"torch threads: {os.environ.get('OMP_NUM_THREADS', 'default')}")
    rows = []
    variants = [(0, "ours")] + ([] if a.no_torchaudio else [(0, "torchaudio")]) + [(s, "ours") for s in a.sub_batch]
    for sub, kernel in variants:
        cmd = [sys.executable, __file__, "--worker", f"{sub}:{kernel}", "--batch", str(a.batch), "--frames", str(a.frames),
               "--units", str(a.units), "--vocab", str(a.vocab), "--joint-dim", str(a.joint_dim), "--device", a.device]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:  # a row saying so; the other variants still run
            print(f"variant sub_batch={sub} failed:\n{out.stderr[-2000:]}", file=sys.stderr)
            last = (out.stderr.strip().splitlines() or ["exit status %d" % out.returncode])[-1]
            name = ("full" if sub <= 0 else f"sub={sub}") + ("" if kernel == "ours" else f", {kernel}")
            rows.append({"variant": name, "error": last[:200]})
            continue
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    ok = [r for r in rows if "error" not in r]
    print("| variant | peak memory | saved for backward | time (fwd+bwd) | loss - first |")
    print("|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['variant']} | failed: {r['error']} | | | |")
            continue
        print(f"| {r['variant']} | {r['peak_bytes'] / 2**20:,.0f} MiB | {r['saved_bytes'] / 2**20:,.1f} MiB | "
              f"{r['seconds']:.1f} s | {r['loss'] - ok[0]['loss']:+.2e} |")
    if a.json:
        a.json.write_text(json.dumps({"args": {k: v for k, v in vars(a).items() if k != "json"}, "rows": rows},
                                     indent=1, default=str))
    return 0 if len(ok) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
