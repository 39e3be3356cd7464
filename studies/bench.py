"""``foundation bench backbone``: one training step of our backbone against timm and torchscale.

Six encoder stacks of identical size (D, depth, heads, ffn = 4D, exact GELU, no dropout,
train mode) take one random ``(B, T, D)`` tensor. A step is forward + ``out.float().pow(2).mean()``
+ backward, with the gradients dropped (``set_to_none``) before each step. Every model is
warmed up, then the repetitions are interleaved round-robin (the starting model rotates each
round) so that a slow spell of a busy machine hits every model alike; ratios are medians of
the per-round ratios, and a target whose per-round quartiles straddle it is called noise.

The references get our models' weights, converted to their layouts, so all six compute the
same numbers; the outputs are compared once as a sanity check.

Memory: on CUDA the allocator's peak during one step above what was allocated before it
(activations, gradients, temporaries); everywhere, the bytes of the distinct tensor storages
autograd saves for backward, parameters excluded (the activation memory of training).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import platform
import statistics
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from foundation.config import BackboneConfig
from foundation.transformer import Backbone

OURS = ("ours preln", "ours magneto")
REFERENCES = ("timm Pre-LN", "timm Sub-LN", "torchscale subln", "torchscale Pre-LN")
# (ours, reference, the most ours / reference may be, what the issue asks)
TARGETS = [
    ("ours magneto", "timm Sub-LN", 1.00, "no slower than timm's Sub-LN stack"),
    ("ours magneto", "timm Pre-LN", 1.10, "within 1.10x of timm's Pre-LN stack"),
    ("ours magneto", "torchscale subln", 1 / 1.10, "at least 1.10x faster than torchscale subln"),
    ("ours preln", "timm Pre-LN", 1.00, "no slower than timm's Pre-LN stack"),
]
# on CUDA (bf16): what the GPU issue asks at ViT-B size
GPU_TARGETS = [
    ("ours magneto", "timm Sub-LN", 1.00, "no slower than timm's Sub-LN stack"),
    ("ours magneto", "torchscale subln", 1 / 1.5, "at least 1.5x torchscale's Encoder (subln)"),
    ("ours preln", "timm Pre-LN", 1.00, "no slower than timm's Pre-LN stack"),
]
MFU_TARGET = 0.45  # ours magneto, compiled, bf16
# dense bf16 tensor-core peak by the vendor's datasheet (SXM parts), TFLOP/s
BF16_PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0}
# which of ours computes the same function as each reference (for the weight copy and check)
SAME_MATH = {"timm Pre-LN": "ours preln", "timm Sub-LN": "ours magneto",
             "torchscale subln": "ours magneto", "torchscale Pre-LN": "ours preln"}


@dataclass
class Result:
    name: str
    params: int
    ms: list[float] = field(default_factory=list)  # wall clock, one entry per timed repetition
    cpu_ms: list[float] = field(default_factory=list)  # this process's CPU time (all threads), same steps
    saved_bytes: int = 0  # storages saved for backward, parameters excluded
    peak_bytes: int | None = None  # CUDA: allocator peak of one step above its start
    max_abs_diff: float | None = None  # output vs the ours model with the same math

    @property
    def median_ms(self) -> float:
        return statistics.median(self.ms)


# ---------------------------------------------------------------- the six models


class TimmStack(nn.Module):
    """timm's ViT ``Block`` x depth + final LayerNorm (eps 1e-5, as ours and torchscale)."""

    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        from timm.layers import LayerNorm
        from timm.models.vision_transformer import Block

        norm = partial(LayerNorm, eps=cfg.layernorm_eps)
        sub_ln = cfg.norm == "magneto"
        self.blocks = nn.Sequential(*(
            Block(cfg.dim, cfg.heads, mlp_ratio=cfg.ffn_dim / cfg.dim, qkv_bias=True, scale_attn_norm=sub_ln,
                  scale_mlp_norm=sub_ln, norm_layer=norm, act_layer=nn.GELU)
            for _ in range(cfg.depth)
        ))
        self.norm = norm(cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.blocks(x))


class TorchscaleStack(nn.Module):
    """torchscale 0.3.0's ``Encoder``, fed embeddings directly."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(src_tokens=None, token_embeddings=x)["encoder_out"]


def timm_like(ours: Backbone) -> nn.Module:
    """timm's Block stack holding ``ours``' weights: our single-modality encoder uses timm's
    names, only the prefixes differ."""
    model = TimmStack(ours.config)
    state = {k.replace("encoder.layers.", "blocks.").replace("encoder.norm.", "norm."): v
             for k, v in ours.state_dict().items()}
    model.load_state_dict(state)
    return model


def torchscale_like(ours: Backbone) -> nn.Module:
    """torchscale's Encoder holding ``ours``' weights (``foundation.checkpoint``'s converter)."""
    from foundation.checkpoint import to_torchscale, torchscale_args
    from foundation.checkpoint import import_torchscale

    with warnings.catch_warnings():  # torchscale imports timm.models.layers, deprecated in timm 1.x
        warnings.simplefilter("ignore", FutureWarning)
        EncoderConfig, Encoder = import_torchscale()
    encoder = Encoder(EncoderConfig(**torchscale_args(ours.config)))
    encoder.load_state_dict(to_torchscale(ours))
    return TorchscaleStack(encoder)


def build_models(a: argparse.Namespace) -> tuple[dict[str, nn.Module], dict[str, str]]:
    """All six models (ours first), the references holding our weights; and what was skipped."""
    size = dict(dim=a.dim, depth=a.depth, heads=a.heads, ffn_dim=4 * a.dim)
    models: dict[str, nn.Module] = {
        f"ours {norm}": Backbone(BackboneConfig(**size, norm=norm)) for norm in ("preln", "magneto")
    }
    makers: dict[str, Callable[[Backbone], nn.Module]] = {
        "timm Pre-LN": timm_like, "timm Sub-LN": timm_like,
        "torchscale subln": torchscale_like, "torchscale Pre-LN": torchscale_like,
    }
    skipped: dict[str, str] = {}
    for name, make in makers.items():
        if a.models and name not in a.models:
            continue
        try:
            models[name] = make(models[SAME_MATH[name]])
        except ImportError as e:
            skipped[name] = str(e).splitlines()[0]
    if a.models:  # ours are built first: the references copy their weights
        models = {n: m for n, m in models.items() if n in a.models}
    for model in models.values():
        model.to(a.device).train()
    if a.compile:
        for model in models.values():
            compile_blocks(model, a.compile_backend)
    return models, skipped


def compile_blocks(model: nn.Module, backend: str = "inductor") -> None:
    """``torch.compile`` each block in place (regional compilation, as PyTorch's recipe
    for stacks of identical layers): the blocks share one compiled graph, so a 12- or
    18-layer stack compiles in the time of one block; the same for every model here."""
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    blocks = [m for m in model.modules() if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) > 1
              and len({type(layer) for layer in m}) == 1]
    if not blocks:
        raise ValueError(f"{type(model).__name__}: no ModuleList of blocks to compile")
    for layers in blocks:
        for layer in layers:
            layer.compile(backend=backend)


def step_flops(a: argparse.Namespace) -> float:
    """Model FLOPs of one training step (forward + backward = 3 x forward; matrix products
    only, attention's recomputation in backward not counted, as MFU is usually defined):
    per layer 2BT(4D^2 + 2DF) for the projections and 4BT^2D for the attention scores and
    the weighted values."""
    B, T, D, F = a.batch, a.tokens, a.dim, 4 * a.dim
    return 3 * a.depth * (2 * B * T * (4 * D * D + 2 * D * F) + 4 * B * T * T * D)


def peak_flops(a: argparse.Namespace) -> float | None:
    if a.peak_tflops:
        return a.peak_tflops * 1e12
    if a.device != "cuda" or a.dtype != "bf16":
        return None
    name = torch.cuda.get_device_name()
    return next((v * 1e12 for k, v in BF16_PEAK_TFLOPS.items() if k in name), None)


def mfu(r: Result, a: argparse.Namespace) -> float | None:
    peak = peak_flops(a)
    return None if peak is None else step_flops(a) / (r.median_ms / 1e3) / peak


# ---------------------------------------------------------------- measuring


def autocast(a: argparse.Namespace):
    if a.dtype == "bf16":
        return torch.autocast(device_type=a.device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def train_step(model: nn.Module, x: torch.Tensor, a: argparse.Namespace) -> None:
    model.zero_grad(set_to_none=True)
    with autocast(a):
        out = model(x)
    out.float().pow(2).mean().backward()


def saved_for_backward(model: nn.Module, x: torch.Tensor, a: argparse.Namespace) -> int:
    """Bytes of the distinct storages autograd keeps for backward, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    model.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with autocast(a):
            out = model(x)
        loss = out.float().pow(2).mean()
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(seen.values())


def cuda_step_peak(model: nn.Module, x: torch.Tensor, a: argparse.Namespace) -> int:
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    train_step(model, x, a)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - start


def timed_step(model: nn.Module, x: torch.Tensor, a: argparse.Namespace) -> tuple[float, float]:
    """(wall ms, process CPU ms) per step."""
    sync(a.device)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(a.steps):
        train_step(model, x, a)
    sync(a.device)
    return (time.perf_counter() - t0) * 1e3 / a.steps, (time.process_time() - c0) * 1e3 / a.steps


@torch.no_grad()
def output_diffs(models: dict[str, nn.Module], x: torch.Tensor, a: argparse.Namespace) -> dict[str, float]:
    with autocast(a):
        outs = {name: m(x).float() for name, m in models.items()}
    return {name: (outs[name] - outs[SAME_MATH[name]]).abs().max().item()
            for name in outs if SAME_MATH.get(name) in outs}


def run(a: argparse.Namespace) -> tuple[dict[str, Result], dict[str, str]]:
    torch.manual_seed(a.seed)
    models, skipped = build_models(a)
    x = torch.randn(a.batch, a.tokens, a.dim, device=a.device)
    results = {n: Result(n, sum(p.numel() for p in m.parameters())) for n, m in models.items()}
    for name, diff in output_diffs(models, x, a).items():
        results[name].max_abs_diff = diff
    for name, model in models.items():
        for _ in range(a.warmup):
            train_step(model, x, a)
        results[name].saved_bytes = saved_for_backward(model, x, a)
        if a.device == "cuda":
            results[name].peak_bytes = cuda_step_peak(model, x, a)
    names = list(models)
    gc.collect()
    gc.disable()  # as timeit does: no collector pauses inside a timed step
    try:
        for r in range(a.reps):
            for name in names[r % len(names):] + names[: r % len(names)]:  # rotate who goes first
                wall, cpu = timed_step(models[name], x, a)
                results[name].ms.append(wall)
                results[name].cpu_ms.append(cpu)
            if a.progress:
                print(f"  round {r + 1}/{a.reps}", file=sys.stderr, flush=True)
    finally:
        gc.enable()
    return results, skipped


def paired_ratios(ours: Result, ref: Result) -> list[float]:
    """ours/ref for each round: both were timed moments apart, so slow drift cancels."""
    return [o / r for o, r in zip(ours.ms, ref.ms)]


def paired_ratio(ours: Result, ref: Result) -> float:
    return statistics.median(paired_ratios(ours, ref))


# ---------------------------------------------------------------- reporting


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def spread(ms: list[float]) -> str:
    if len(ms) < 4:
        return "-"
    q = statistics.quantiles(ms, n=4)
    return f"{100 * (q[2] - q[0]) / statistics.median(ms):.0f}%"


def header(a: argparse.Namespace) -> list[str]:
    if a.device == "cuda":
        where = torch.cuda.get_device_name()
    else:
        where = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                where = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
    return [
        f"config: D={a.dim} depth={a.depth} heads={a.heads} ffn={4 * a.dim} T={a.tokens} B={a.batch} "
        f"dtype={a.dtype} device={a.device} compile={'blocks' if a.compile else 'off'} reps={a.reps} "
        f"steps/rep={a.steps} warmup={a.warmup} seed={a.seed}",
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {where}; "
        f"python {platform.python_version()}",
    ]


def md_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def md_header(cols: list[str]) -> list[str]:
    return [md_row(cols), "|---|" + "---:|" * (len(cols) - 1)]


def table(results: dict[str, Result], a: argparse.Namespace) -> list[str]:
    cuda = a.device == "cuda"
    cols = ["model", "ms/step (median)", "IQR / median"]
    cols += ["CUDA step peak (MiB)"] if cuda else ["CPU ms/step (median)"]
    cols += ["saved for backward (MiB)"]
    cols += ["params (M)", "max abs diff vs ours"]
    show_mfu = peak_flops(a) is not None
    if show_mfu:
        cols.insert(1, "MFU")
    lines = md_header(cols)
    for r in results.values():
        cells = [r.name, f"{r.median_ms:.1f}", spread(r.ms)]
        if show_mfu:
            cells.insert(1, f"{100 * mfu(r, a):.1f}%")
        cells += [mib(r.peak_bytes)] if cuda else [f"{statistics.median(r.cpu_ms):.1f}"]
        cells += [mib(r.saved_bytes)]
        cells += [f"{r.params / 1e6:.2f}", "-" if r.max_abs_diff is None else f"{r.max_abs_diff:.1e}"]
        lines.append(md_row(cells))
    return lines


def ratio_table(results: dict[str, Result]) -> list[str]:
    refs = [n for n in REFERENCES if n in results]
    lines = md_header(["ours / reference"] + refs)
    for o in (o for o in OURS if o in results):
        lines.append(md_row([f"{o}, time"] + [f"{paired_ratio(results[o], results[r]):.3f}" for r in refs]))
        mem = [results[o].saved_bytes / results[r].saved_bytes if results[r].saved_bytes else None for r in refs]
        lines.append(md_row([f"{o}, saved memory"] + ["-" if m is None else f"{m:.3f}" for m in mem]))
    return lines


def target_lines(results: dict[str, Result], a: argparse.Namespace) -> list[str]:
    lines = []
    if a.device == "cuda" and peak_flops(a) is not None and "ours magneto" in results:
        got = mfu(results["ours magneto"], a)
        verdict = "met" if got >= MFU_TARGET else "MISSED" if a.compile else "missed (eager; the aim is compiled)"
        lines.append(f"- ours magneto MFU = {100 * got:.1f}% of {peak_flops(a) / 1e12:.0f} TFLOP/s "
                     f"({step_flops(a) / 1e12:.2f} TFLOP a step); target >= {100 * MFU_TARGET:.0f}%: {verdict}")
    for o, ref, limit, what in (GPU_TARGETS if a.device == "cuda" else TARGETS):
        if ref not in results or o not in results:
            lines.append(f"- {o} vs {ref}: skipped ({what})")
            continue
        ratios = paired_ratios(results[o], results[ref])
        ratio = statistics.median(ratios)
        q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) >= 4 else (ratio, ratio, ratio)
        if q3 <= limit:
            verdict = "met"
        elif q1 > limit:
            verdict = "MISSED"
        else:  # a target the rounds straddle is not decided by this run
            verdict = "met" if ratio <= limit else "missed"
            verdict += " (within noise: the rounds' quartiles straddle it)"
        lines.append(f"- {o} / {ref} = {ratio:.3f} [quartiles {q1:.3f}-{q3:.3f}] (speed-up {1 / ratio:.2f}x); "
                     f"target <= {limit:.3f}, {what}: {verdict}")
    return lines


# reference against reference: what the math costs whoever implements it
CONTEXT = [
    ("timm Sub-LN", "timm Pre-LN", "what Sub-LN's two extra LayerNorms cost in timm"),
    ("torchscale subln", "timm Sub-LN", "same math, torchscale's code: bmm + fp32 softmax attention, separate q/k/v"),
]


def context_lines(results: dict[str, Result]) -> list[str]:
    return [f"- {a} / {b} = {paired_ratio(results[a], results[b]):.3f} ({why})"
            for a, b, why in CONTEXT if a in results and b in results]


def report(results: dict[str, Result], skipped: dict[str, str], a: argparse.Namespace) -> str:
    out = header(a) + [""] + table(results, a) + [""]
    out += ["Time ratios are medians over rounds of ours/reference timed in the same round "
            "(< 1: ours faster); memory ratios compare the saved-for-backward bytes.", ""]
    out += ratio_table(results) + ["", "Targets:"] + target_lines(results, a)
    out += [f"- {n}: skipped, {why}" for n, why in skipped.items()]
    out += ["", "References against each other:"] + context_lines(results)
    out += ["", "saved for backward: bytes of the distinct non-parameter storages autograd keeps for "
            "backward in one step (activation memory)"
            + ("; CUDA step peak: torch.cuda.max_memory_allocated during one step minus memory "
               "allocated before it." if a.device == "cuda" else "; no allocator peak counter on CPU.")]
    if a.device == "cpu":
        out += ["CPU ms/step: this process's CPU time summed over its threads for the same steps; a "
                "step that waited for cores taken by other work shows a wall time well above "
                "CPU time / threads."]
    out += ["max abs diff vs ours: largest output difference from our model of the same math, with "
            "the same weights copied in (a sanity check that all rows compute the same function)."]
    return "\n".join(out)


# ---------------------------------------------------------------- command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="foundation bench backbone",
        description="Time a forward+backward training step and its memory for our preln and magneto "
        "backbones against timm's ViT Block stacks (Pre-LN, Sub-LN) and torchscale's Encoder "
        "(subln, Pre-LN) at identical sizes.",
    )
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--tokens", type=int, default=197, help="sequence length T")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--reps", type=int, default=20, help="interleaved rounds; each model is timed once per round")
    p.add_argument("--steps", type=int, default=1, help="training steps per timed repetition")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per model before timing")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="bf16: autocast (meant for cuda)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile every block of every model (regional compilation) before timing")
    p.add_argument("--compile-backend", default="inductor",
                   help="torch.compile's backend (eager: graph capture only, no code generation; a quick check)")
    p.add_argument("--models", nargs="+", default=None, metavar="NAME",
                   help=f"time only these (default: all of {', '.join(OURS + REFERENCES)})")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the chip's bf16 peak for the MFU column (default: the datasheet value for H100/H200/A100)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="also write the results (every repetition) here")
    p.add_argument("--progress", action="store_true", help="print each finished round to stderr")
    a = p.parse_args(argv)
    for name in ("dim", "depth", "heads", "tokens", "batch", "reps", "steps"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1")
    if a.warmup < 0:
        p.error("--warmup must be >= 0")
    if a.threads is not None and a.threads < 1:
        p.error("--threads must be >= 1")
    if a.dim % a.heads:
        p.error(f"--heads {a.heads} must divide --dim {a.dim}")
    unknown = set(a.models or ()) - set(OURS + REFERENCES)
    if unknown:
        p.error(f"--models: unknown {sorted(unknown)}; choose from {', '.join(OURS + REFERENCES)}")
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    results, skipped = run(a)
    print(report(results, skipped, a))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
            "environment": header(a)[1],
            "results": [{**asdict(r), "median_ms": r.median_ms, "mfu": mfu(r, a)} for r in results.values()],
            "step_tflop": step_flops(a) / 1e12,
            "device_name": torch.cuda.get_device_name() if a.device == "cuda" else None,
            "targets": target_lines(results, a),
            "ratios": {o: {r: paired_ratio(results[o], results[r]) for r in REFERENCES if r in results}
                       for o in OURS if o in results},
            "skipped": skipped,
        }
        a.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
