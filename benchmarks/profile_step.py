"""Where a training step of our backbone spends its time, and how MFU moves with batch size
and compile mode: the check that says why ViT-B Magneto sits below its MFU aim.

    python benchmarks/profile_step.py --out runs/profile                     # CUDA, ViT-B, bf16
    python benchmarks/profile_step.py --device cpu --tiny --out /tmp/prof    # smoke test

For each (compile mode, batch): the median ms of a forward + backward step (the same step as
``foundation bench backbone``) and its MFU. Then one step under ``torch.profiler`` at the
first setting: device time per kind of kernel (matrix products, attention, fused
element-wise / norm kernels, the rest) and how much of the step's wall time the device was
busy at all. A step whose kernels fill only part of its wall time is bound by the host
(launches, Python), which CUDA graphs (``--modes reduce-overhead``) remove; one whose matrix
products dominate is near what the GEMMs allow.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402

from foundation.config import BackboneConfig  # noqa: E402
from foundation.transformer import Backbone  # noqa: E402
from studies.bench import BF16_PEAK_TFLOPS, step_flops as bench_step_flops  # noqa: E402

# kernel-name fragments -> kind (the first that matches); cuBLAS / CUTLASS GEMMs go by several names
KINDS = [
    ("matmul", ("gemm", "xmma", "cutlass", "nvjet", "cublas", "matmul", "addmm", "::mm", "bmm")),
    ("attention", ("flash", "fmha", "attention", "cudnn", "sdpa", "softmax")),
    ("fused (triton)", ("triton",)),
    ("layer norm", ("layer_norm", "layernorm")),
    ("element-wise", ("elementwise", "vectorized", "reduce", "copy", "fill", "gelu", "add", "mul")),
]


def kind(name: str) -> str:
    low = name.lower()
    return next((k for k, frags in KINDS if any(f in low for f in frags)), "other")


def step_flops(B: int, T: int, D: int, depth: int) -> float:
    """``foundation bench backbone``'s count, so the two MFU columns agree."""
    return bench_step_flops(argparse.Namespace(batch=B, tokens=T, dim=D, depth=depth))


def build(a: argparse.Namespace, mode: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = Backbone(BackboneConfig(dim=a.dim, depth=a.depth, heads=a.heads, ffn_dim=4 * a.dim, norm=a.norm))
    model.to(a.device).train()
    if mode != "eager":
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        for layer in model.encoder.layers:  # regional, as ``foundation bench backbone --compile``
            layer.compile(mode=None if mode == "default" else mode)
    return model


def make_step(model, x, a):
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32

    def step():
        model.zero_grad(set_to_none=True)
        with torch.autocast(a.device, dtype=dtype, enabled=a.device == "cuda"):
            out = model(x)
        out.float().pow(2).mean().backward()
    return step


def sync(a) -> None:
    if a.device == "cuda":
        torch.cuda.synchronize()


def time_step(step, a) -> float:
    for _ in range(a.warmup):
        step()
    times = []
    for _ in range(a.reps):
        sync(a)
        t0 = time.perf_counter()
        step()
        sync(a)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def profile(step, a) -> dict:
    from torch.profiler import ProfilerActivity, profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device == "cuda" else [])
    step()
    sync(a)
    with torch_profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(a.profile_steps):
            step()
        sync(a)
        wall = (time.perf_counter() - t0) * 1e3 / a.profile_steps
    by_kind: dict[str, float] = {}
    top: dict[str, float] = {}
    for e in prof.key_averages():
        us = e.self_device_time_total if a.device == "cuda" else e.self_cpu_time_total
        if us <= 0 or (a.device == "cuda" and e.device_type != torch.autograd.DeviceType.CUDA):
            continue
        ms = us / 1e3 / a.profile_steps
        by_kind[kind(e.key)] = by_kind.get(kind(e.key), 0.0) + ms
        top[e.key] = top.get(e.key, 0.0) + ms
    busy = sum(by_kind.values())
    return {"wall_ms": wall, "busy_ms": busy, "by_kind": by_kind,
            "top": sorted(top.items(), key=lambda kv: -kv[1])[:12]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--norm", default="magneto")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--depth", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--tokens", type=int, default=197)
    p.add_argument("--batches", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--modes", nargs="+", default=["default", "reduce-overhead"],
                   choices=["eager", "default", "reduce-overhead", "max-autotune-no-cudagraphs"])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tiny", action="store_true", help="a 2-layer 64-wide model, batch 2 and 4, eager: a smoke test")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    if a.tiny:
        a.dim, a.depth, a.heads, a.tokens, a.batches, a.modes, a.reps = 64, 2, 2, 17, [2, 4], ["eager"], 2
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available")
    name = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    peak = next((v * 1e12 for k, v in BF16_PEAK_TFLOPS.items() if k in name), None)

    rows, prof = [], None
    for mode in a.modes:
        for B in a.batches:
            x = torch.randn(B, a.tokens, a.dim, device=a.device)
            model = build(a, mode)
            step = make_step(model, x, a)
            try:
                ms = time_step(step, a)
            except torch.OutOfMemoryError:
                rows.append({"mode": mode, "batch": B, "error": "out of memory"})
                continue
            flops = step_flops(B, a.tokens, a.dim, a.depth)
            rows.append({"mode": mode, "batch": B, "ms": ms, "tflops": flops / ms / 1e9,
                         "mfu": None if peak is None else flops / (ms / 1e3) / peak})
            if prof is None:
                prof = {"mode": mode, "batch": B, **profile(step, a)}
            del model, x, step
            if a.device == "cuda":
                torch.cuda.empty_cache()

    lines = [f"{a.norm}, D {a.dim}, {a.depth} layers, {a.tokens} tokens, {name}"
             + ("" if a.device == "cpu" else ", bf16 autocast"), "",
             "| compile mode | batch | ms / step | TFLOP/s | MFU |", "|---|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['mode']} | {r['batch']} | {r['error']} | | |")
        else:
            lines.append(f"| {r['mode']} | {r['batch']} | {r['ms']:.1f} | {r['tflops']:.0f} | "
                         + ("-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%") + " |")
    if prof:
        busy = prof["busy_ms"] / prof["wall_ms"]
        lines += ["", f"Profile of one step ({prof['mode']}, batch {prof['batch']}): {prof['wall_ms']:.1f} ms wall, "
                  f"kernels {prof['busy_ms']:.1f} ms ({100 * busy:.0f} % of it; the rest the device waits on the host)",
                  "", "| kernel kind | ms / step | share of kernel time |", "|---|---:|---:|"]
        for k, ms in sorted(prof["by_kind"].items(), key=lambda kv: -kv[1]):
            lines.append(f"| {k} | {ms:.2f} | {100 * ms / max(prof['busy_ms'], 1e-9):.0f} % |")
        lines += ["", "Top kernels (ms / step):"] + [f"- {ms:.2f} {name[:110]}" for name, ms in prof["top"]]
    text = "\n".join(lines)
    print(text)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "profile.md").write_text(text + "\n")
    (a.out / "profile.json").write_text(json.dumps({"rows": rows, "profile": prof, "device": name}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
