"""The CUDA paths: bf16 autocast, the fused attention kernels, torch.compile, activation
checkpointing, DDP and FSDP2, a bit-exact resume and the RNN-T joint, each on the GPU.

Run with ``pytest -m gpu`` on a machine with CUDA (``benchmarks/gpu_check.sh`` does); without
CUDA every test here is skipped (``tests/conftest.py``)."""
from __future__ import annotations

import os

# cuBLAS reads this when its first handle is made: set before any test touches the GPU, so
# that ``torch.use_deterministic_algorithms`` can make matrix products reproducible
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from foundation.config import BackboneConfig  # noqa: E402
from foundation.scaling import NORMS  # noqa: E402
from foundation.transformer import Backbone  # noqa: E402
from support import read_records, run_config  # noqa: E402

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda", 0)
REPORT = Path(os.environ.get("GPU_TEST_REPORT", "")) if os.environ.get("GPU_TEST_REPORT") else None


def note(key: str, value) -> None:
    """Facts worth printing beside pass/fail (graph breaks, memory): appended to the JSON file
    named by $GPU_TEST_REPORT when set (gpu_check.sh sets it), and printed."""
    print(f"{key}: {value}")
    if REPORT is not None:
        REPORT.parent.mkdir(parents=True, exist_ok=True)
        with REPORT.open("a") as f:
            f.write(json.dumps({key: value}) + "\n")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def backbone(norm: str = "magneto", **kw) -> Backbone:
    size = dict(dim=256, depth=4, heads=4, ffn_dim=1024)
    return Backbone(BackboneConfig(**{**size, **kw}, norm=norm)).to(CUDA)


def forward_backward(model: nn.Module, x: torch.Tensor, bf16: bool, **kw) -> tuple[torch.Tensor, dict]:
    """Output and gradients of a loss against a fixed random direction (the mean square of
    a LayerNorm's output would be nearly constant, leaving gradients of rounding noise)."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        out = model(x, **kw)
    direction = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.device)
    (out.float() * direction).mean().backward()
    return out.detach().float(), {n.removeprefix("_orig_mod."): p.grad.detach().clone()
                                  for n, p in model.named_parameters() if p.grad is not None}


# --------------------------------------------------------------------------- bf16


@pytest.mark.parametrize("norm", NORMS)
def test_bf16_autocast_matches_fp32_forward_and_backward(norm):
    """Every rule under bf16 autocast against the same weights in fp32 (TF32 off): output and
    every gradient within bf16's rounding (relative L2 error < 2e-2 for the output, < 5e-2
    for the gradients, about 10x what 8 mantissa bits give over four layers)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    model = backbone(norm)
    x = torch.randn(4, 64, 256, device=CUDA)
    pad = torch.zeros(4, 64, dtype=torch.bool, device=CUDA)
    pad[1, 50:] = True
    out32, g32 = forward_backward(model, x, bf16=False, padding_mask=pad)
    out16, g16 = forward_backward(model, x, bf16=True, padding_mask=pad)
    assert torch.isfinite(out16).all()
    keep = ~pad[..., None]
    assert rel(out16 * keep, out32 * keep) < 2e-2
    worst = max(g32, key=lambda n: rel(g16[n], g32[n]))
    note(f"bf16 {norm}: output rel err", round(rel(out16 * keep, out32 * keep), 5))
    note(f"bf16 {norm}: worst grad rel err", [worst, round(rel(g16[worst], g32[worst]), 5)])
    assert g16.keys() == g32.keys()
    assert rel(g16[worst], g32[worst]) < 5e-2, worst


# --------------------------------------------------------------------------- attention kernels


def _attention_case(kind: str):
    torch.manual_seed(1)
    if kind == "plain":
        return backbone(), {}
    if kind == "padding":
        pad = torch.zeros(4, 197, dtype=torch.bool, device=CUDA)
        pad[0, 150:] = True
        pad[3, 7:] = True
        return backbone(), {"padding_mask": pad}
    if kind == "rel_pos_1d":  # BEiT-3 / speech: a learned bias on every layer, plus padding
        pad = torch.zeros(4, 197, dtype=torch.bool, device=CUDA)
        pad[2, 100:] = True
        return backbone(rel_pos="1d"), {"padding_mask": pad}
    if kind == "rel_pos_2d":  # BEiT: 14 x 14 patches + the class token
        return backbone(rel_pos="2d", rel_pos_grid=(14, 14), rel_pos_prefix=1), {}
    raise ValueError(kind)


@pytest.mark.parametrize("kind,backend", [
    ("plain", SDPBackend.FLASH_ATTENTION),
    ("plain", SDPBackend.EFFICIENT_ATTENTION),
    ("padding", SDPBackend.EFFICIENT_ATTENTION),
    ("rel_pos_1d", SDPBackend.EFFICIENT_ATTENTION),
    ("rel_pos_2d", SDPBackend.EFFICIENT_ATTENTION),
])
def test_attention_runs_on_the_fused_kernel(kind, backend):
    """With SDPA restricted to one fused kernel the backbone still runs forward and backward
    under bf16 (SDPA raises when no allowed kernel takes the inputs), and matches the math
    kernel. Flash takes no mask at all, so it is tried on the unmasked stack only; masks and
    relative position bias go to the memory-efficient kernel."""
    model, kw = _attention_case(kind)
    x = torch.randn(4, 197, 256, device=CUDA)
    with sdpa_kernel([backend]):
        out, grads = forward_backward(model, x, bf16=True, **kw)
    with sdpa_kernel([SDPBackend.MATH]):
        ref, ref_grads = forward_backward(model, x, bf16=True, **kw)
    keep = ~kw["padding_mask"][..., None] if "padding_mask" in kw else torch.ones_like(out[..., :1], dtype=torch.bool)
    assert torch.isfinite(out).all()
    assert rel(out * keep, ref * keep) < 2e-2
    if kind.startswith("rel_pos"):  # the bias parameters learn through the fused kernel
        name = next(n for n in grads if "rel_pos" in n)
        assert rel(grads[name], ref_grads[name]) < 5e-2


# --------------------------------------------------------------------------- torch.compile


def test_compiled_backbone_equals_eager_without_graph_breaks():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(2)
    model = backbone(rel_pos="1d")
    x = torch.randn(4, 64, 256, device=CUDA)
    pad = torch.zeros(4, 64, dtype=torch.bool, device=CUDA)
    pad[1, 40:] = True
    explained = torch._dynamo.explain(model)(x, padding_mask=pad)
    note("compile: backbone graph breaks", explained.graph_break_count)
    note("compile: backbone break reasons", [str(b.reason)[:200] for b in explained.break_reasons][:5])
    torch._dynamo.reset()
    eager_out, eager_grads = forward_backward(model, x, bf16=False, padding_mask=pad)
    compiled = torch.compile(model)
    out, grads = forward_backward(compiled, x, bf16=False, padding_mask=pad)
    keep = ~pad[..., None]
    assert rel(out * keep, eager_out * keep) < 1e-4
    assert max(rel(grads[n].cpu(), eager_grads[n].cpu()) for n in eager_grads) < 1e-3
    assert explained.graph_break_count == 0


def tiny_run(tmp_path: Path, **train) -> dict:
    """The engine's tiny seq2seq run (encoder-decoder) on the GPU."""
    return {
        "run_name": "run", "output_dir": str(tmp_path), "seed": 0, "device": "cuda",
        "backbone": {"arch": "encoder_decoder", "dim": 64, "depth": 2, "heads": 4, "ffn_dim": 128,
                     "dropout": 0.1},
        "tasks": [{"name": "seq2seq", "vocab_size": 12, "min_len": 3, "max_len": 8, "train_size": 128,
                   "eval_size": 32}],
        "optim": {"lr": 3e-3}, "schedule": {"warmup_steps": 2},
        "train": {"steps": 8, "batch_size": 16, **train},
        "eval": {"every": 0, "batch_size": 32}, "save": {"every": 0, "keep": 2},
        "log": {"progress": False, "writers": ["jsonl"]},
    }


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_records(run_dir) if "loss" in r and "event" not in r}


def test_a_compiled_training_step_equals_eager(tmp_path):
    """``train.compile: true`` through the engine (fp32, TF32 off): the same losses as eager
    over eight optimizer steps, within float rounding."""
    torch.backends.cuda.matmul.allow_tf32 = False
    # no dropout: compiled code draws its masks from another random stream
    eager = run_config(tiny_run(tmp_path, precision="fp32"), "run_name=eager", "backbone.dropout=0.0")
    from torch._dynamo.utils import counters

    counters.clear()
    compiled = run_config(tiny_run(tmp_path, precision="fp32", compile=True), "run_name=compiled",
                          "backbone.dropout=0.0")
    note("compile: engine step graph breaks", dict(counters["graph_break"]))
    assert eager.status == compiled.status == "finished"
    a, b = losses(tmp_path / "eager"), losses(tmp_path / "compiled")
    assert a.keys() == b.keys() and len(a) == 8
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-3), step


# --------------------------------------------------------------------------- activation checkpointing


def test_activation_checkpointing_same_gradients_less_memory():
    torch.manual_seed(3)
    x = torch.randn(8, 256, 256, device=CUDA)
    peaks, grads = {}, {}
    for ckpt in (False, True):
        torch.manual_seed(3)
        model = backbone(depth=8, checkpoint_activations=ckpt)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        _, grads[ckpt] = forward_backward(model, x, bf16=True)
        torch.cuda.synchronize()
        peaks[ckpt] = torch.cuda.max_memory_allocated() - start
    note("checkpointing: step peak MiB (off, on)", [round(peaks[False] / 2**20, 1), round(peaks[True] / 2**20, 1)])
    assert max(rel(grads[True][n], grads[False][n]) for n in grads[False]) < 1e-2
    assert peaks[True] < 0.6 * peaks[False]


# --------------------------------------------------------------------------- DDP and FSDP2


class _Head(nn.Module):
    """A backbone and a loss: what ``distributed.shard`` expects (a ``backbone`` attribute)."""

    def __init__(self):
        super().__init__()
        self.backbone = Backbone(BackboneConfig(dim=128, depth=3, heads=4, ffn_dim=512, norm="magneto"))
        self.out = nn.Linear(128, 10)

    def forward(self, x, y):
        h = self.backbone(x)
        return F.cross_entropy(self.out(h.mean(1)), y)


@pytest.fixture
def one_rank_nccl(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1,
                            device_id=CUDA)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _train(model: nn.Module, steps: int = 4) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator(device="cuda").manual_seed(0)
    out = []
    for _ in range(steps):
        x = torch.randn(8, 32, 128, device=CUDA, generator=g)
        y = torch.randint(0, 10, (8,), device=CUDA, generator=g)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(loss.item())
    return out


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_ddp_and_fsdp2_on_one_gpu_train_like_the_plain_model(one_rank_nccl, strategy):
    """One NCCL rank: the engine's wrappers (DDP, FSDP2's ``fully_shard`` per block) take the
    same steps as the bare model."""
    from foundation.engine import distributed

    torch.manual_seed(4)
    plain = _Head().to(CUDA)
    torch.manual_seed(4)
    model = _Head().to(CUDA)
    if strategy == "ddp":
        wrapped = nn.parallel.DistributedDataParallel(model, device_ids=[0])
    else:
        wrapped = distributed.shard(model)
        assert distributed.is_fsdp(wrapped.backbone.encoder.layers[0])
    a, b = _train(plain), _train(wrapped)
    note(f"{strategy}: losses (plain, wrapped)", [a, b])
    assert b == pytest.approx(a, rel=1e-3)
    assert b[-1] < b[0]


# --------------------------------------------------------------------------- resume


def test_resume_on_the_gpu_is_bit_exact(tmp_path):
    """8 steps straight == 4, stop, resume, 4 (dropout on, bf16 autocast): identical losses
    and weights. With ``train.deterministic`` the kernels themselves repeat bit for bit; the
    resume adds nothing to that."""
    from safetensors.torch import load_file

    cfg = tiny_run(tmp_path, deterministic=True)
    straight = run_config(cfg, "run_name=straight", "save.every=4")
    first = run_config(cfg, "run_name=split", "save.every=4", "train.stop_at=4")
    second = run_config(cfg, "run_name=split", "save.every=4", "resume=true")
    assert not torch.are_deterministic_algorithms_enabled()  # the setting was the run's only
    assert first.status == "stopped" and straight.status == second.status == "finished"
    a, b = losses(tmp_path / "straight"), losses(tmp_path / "split")
    assert a == b and len(a) == 8
    wa = load_file(str(tmp_path / "straight/ckpt/step_000008/model.safetensors"))
    wb = load_file(str(tmp_path / "split/ckpt/step_000008/model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


# --------------------------------------------------------------------------- RNN-T joint


def test_rnnt_joint_sub_batched_equals_full_and_cpu():
    """The transducer loss on the GPU: sub-batched == whole lattice == the CPU result."""
    pytest.importorskip("espnet2", reason="the speech extra (ESPnet) is not installed")
    import torchaudio.functional as AF

    if not hasattr(AF, "rnnt_loss"):
        pytest.skip(f"torchaudio {__import__('torchaudio').__version__} has no rnnt_loss")
    from foundation_tasks.asr.transducer import transducer_loss

    torch.manual_seed(5)
    B, T, U, V, J = 6, 40, 12, 50, 64
    enc = torch.randn(B, T, J)
    dec = torch.randn(B, U + 1, J)
    lin = nn.Linear(J, V)
    targets = torch.randint(1, V, (B, U))
    enc_lens = torch.tensor([40, 31, 22, 40, 17, 9])
    tgt_lens = torch.tensor([12, 10, 5, 12, 3, 1])

    def loss_and_grads(device, sub):
        e = enc.detach().clone().to(device).requires_grad_()  # leaves on either device
        d = dec.detach().clone().to(device).requires_grad_()
        out = lin.to(device)
        out.zero_grad(set_to_none=True)
        loss = transducer_loss(e, d, out, torch.tanh, targets.to(device), enc_lens.to(device), tgt_lens.to(device),
                               sub_batch=sub)
        loss.backward()
        return float(loss), [t.detach().cpu() for t in (e.grad, d.grad, out.weight.grad)]

    ref, ref_g = loss_and_grads("cpu", 0)
    for sub in (0, 2):
        val, g = loss_and_grads("cuda", sub)
        assert val == pytest.approx(ref, rel=1e-4)
        assert all(rel(a, b) < 1e-4 for a, b in zip(g, ref_g))
