"""How long one AdamW step takes on a model's parameters: torch's default implementation
(on a CPU the per-tensor loop) against its fused kernel, which the engine uses wherever every parameter allows it
(``foundation.engine.optim.build_optimizer``). Measured in the same process, on the same
parameters, gradients and parameter groups (layer decay, no-decay sets) as training builds.

    python benchmarks/optimizer_step.py runs/demo/vqa/runs/magneto_lr0.001_seed0 [RUN ...] [--steps 50]

Each model is any run directory / model file that ``foundation predict`` takes. The VL
models' AdamW step is large for their size: 3.2M of their 3.7M parameters are the CLIP BPE
text embedding (49,409 rows), all updated every step.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def time_steps(model, engine: bool, steps: int, seed: int = 0) -> tuple[float, list]:
    """(seconds per optimizer step, parameters after ``steps`` steps) on fixed random gradients:
    the engine's optimizer (``build_optimizer``, fused) or torch's default AdamW (on a CPU the
    per-tensor loop) over the same parameter groups."""
    import torch

    from foundation.engine.config import OptimConfig
    from foundation.engine.optim import build_optimizer, param_groups

    model, cfg = copy.deepcopy(model), OptimConfig(lr=1e-3)
    if engine:
        opt = build_optimizer(model, cfg)
    else:
        opt = torch.optim.AdamW(param_groups(model, cfg), lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps)
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g) * 1e-2
    opt.step()  # the first step allocates the state: not timed
    start = time.perf_counter()
    for _ in range(steps):
        opt.step()
    return (time.perf_counter() - start) / steps, [p.detach() for p in model.parameters()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", help="run directories or model files")
    p.add_argument("--steps", type=int, default=50)
    a = p.parse_args(argv)

    import torch

    from foundation import checkpoint as ckpt
    from foundation.checkpoint.format import CheckpointError
    from foundation.engine.run_state import model_file
    from foundation.engine.model import MultiTaskModel

    models = []
    for name in a.models:  # all read before any output: a bad one is one line, not half a table
        try:
            model = ckpt.load(model_file(name))
        except (CheckpointError, FileNotFoundError, OSError) as e:
            print(f"optimizer_step: error: {e}", file=sys.stderr)
            return 2
        if not isinstance(model, MultiTaskModel):
            print(f"optimizer_step: error: {name}: not a training run's model", file=sys.stderr)
            return 2
        models.append((name, model))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {a.steps} steps each")
    print("| model | parameters | default ms / step | fused ms / step | fused / default | largest difference |")
    print("|---|---|---|---|---|---|")
    for name, model in models:
        loop, after_loop = time_steps(model, engine=False, steps=a.steps)
        fused, after_fused = time_steps(model, engine=True, steps=a.steps)
        diff = max((x - y).abs().max().item() for x, y in zip(after_loop, after_fused))
        n = sum(p.numel() for p in model.parameters())
        print(f"| {name} | {n:,} | {loop * 1e3:.2f} | {fused * 1e3:.2f} | {fused / loop:.2f} | {diff:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
