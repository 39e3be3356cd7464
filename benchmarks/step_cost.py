"""What a training step of the tiny recipes costs against a plain PyTorch loop on the same model
size, batch and data, side by side in one process (one thread), with where our step's time goes.

    foundation data make vision --out data/vision-demo
    foundation data make speech --out data/speech-demo
    OMP_NUM_THREADS=1 python benchmarks/step_cost.py                     # vision and speech, both norms
    OMP_NUM_THREADS=1 python benchmarks/step_cost.py --tasks vision --steps 300 --norms preln

Vision: ``configs/vision/tiny_finetune.yaml`` from scratch through ``foundation train`` (the
engine, our image folder, timm's per-image transforms, the loop's logging) against the plain
timm ViT loop of ``benchmarks/reference_vision.py`` (the same width, depth, heads, patch and
batch; the split held as one tensor, flips on the batch): Pre-LN against timm's ViT as it comes,
Magneto against the same ViT with timm's Sub-LN (``scale_attn_norm``, ``scale_mlp_norm``: the
LayerNorms Magneto adds before the attention's output projection and the FFN's second layer,
the architecture ``studies.bench`` holds ours against). Speech: ``configs/asr/tiny.yaml``
(the transducer from step 1, ``rnnt_start=0``) against the plain PyTorch transducer of
``benchmarks/asr_reference.py`` on the same length buckets (our data set and collate, the
same features) with the recipe's VGG front end (``--frontend vgg``): the same sizes, but
torch's ``nn.TransformerEncoder`` (Pre-LN, sinusoidal positions, no relative position bias).

A step's cost is CPU time (``time.process_time``, one thread: on an idle core the wall time,
and unmoved by other processes on a busy machine) per step after ``--warmup`` steps: for the
plain loops between two stamps; for ours the difference of two ``foundation train`` runs of
``--warmup`` and ``--steps`` steps (everything of the engine's step is in: data loading,
logging, the guard when on; start-up, the first epoch's image decoding and the final
evaluation cancel). The breakdown of ours times the pieces alone on one batch: the data (the
next batch of the training stream), and forward + backward + AdamW of the same model. Ratios
are ours / plain; the runs alternate. The process keeps its freed memory as every ``foundation``
command does (``foundation/engine/host_memory.py``), for both loops; ``benchmarks/host_memory.py``
measures what that saves.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def per_step(stamps: list[tuple[int, float]], warmup: int) -> float:
    """Seconds a step between the first stamp at or after ``warmup`` and the last."""
    (s0, t0), (s1, t1) = next(p for p in stamps if p[0] >= warmup), stamps[-1]
    if s1 <= s0:
        raise SystemExit(f"step_cost: --steps must exceed --warmup by at least one log interval (got {s0}..{s1})")
    return (t1 - t0) / (s1 - s0)


# --------------------------------------------------------------------------- ours: the engine


def ours(config: str, overrides: list[str], out: Path, name: str, steps: int, warmup: int) -> float:
    """CPU seconds a step of ``foundation train``: two runs, ``warmup`` and ``steps`` steps long, and
    the difference of their CPU times over the difference of their steps (start-up, the first
    epoch's image decoding and the final evaluation are in both, and cancel)."""
    from foundation.engine.config import load_config
    from foundation.engine.loop import train

    cpu = []
    for n in (warmup, steps):
        cfg, specs = load_config(ROOT / config, [*overrides, f"train.steps={n}", "eval.every=0", "save.every=0",
                                                  "log.every=10", "log.progress=false", f"output_dir={out}",
                                                  f"run_name={name}-{n}", "overwrite=true"])
        start = time.process_time()
        result = train(cfg, specs)
        cpu.append(time.process_time() - start)
        if result.status != "finished":
            raise SystemExit(f"step_cost: our run {name} ended {result.status}: {result.message}")
    return (cpu[1] - cpu[0]) / (steps - warmup)


def breakdown(config: str, overrides: list[str], repeats: int = 20) -> dict[str, float]:
    """Our step's pieces alone, seconds each: the next training batch; forward + backward + AdamW."""
    from foundation.engine.config import load_config
    from foundation.engine.data import TaskStream, to_device
    from foundation.engine.loop import build_model

    cfg, specs = load_config(ROOT / config, overrides)
    model = build_model(cfg, specs, log=lambda *a: None)
    spec = specs[0]
    task = model.tasks[spec.id]
    batch_size = spec.batch_size or cfg.train.batch_size
    stream = TaskStream(task.train_dataset(), task.collate, batch_size=batch_size, rank=0, world=1, seed=cfg.seed,
                        num_workers=0, name=spec.id)
    for _ in range(len(stream.dataset) // batch_size + 1):  # an epoch first: the decoded images are cached
        next(stream)
    t = time.process_time()
    batches = [next(stream) for _ in range(repeats)]
    data = (time.process_time() - t) / repeats
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()

    def step(batch) -> None:
        loss, _ = model(spec.id, to_device(batch, torch.device("cpu")))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for b in batches[:3]:
        step(b)
    t = time.process_time()
    for b in batches:
        step(b)
    return {"data": data, "model": (time.process_time() - t) / repeats}


# --------------------------------------------------------------------------- plain loops


def plain_vit(num_classes: int, img_size: int, sub_ln: bool = False) -> torch.nn.Module:
    """reference_vision.py's timm ViT of the tiny recipe's size; ``sub_ln``: timm's Sub-LN blocks
    (a LayerNorm before the attention's output projection and before the FFN's second layer)."""
    import timm

    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=img_size, patch_size=4, embed_dim=64,
                             depth=4, num_heads=2, mlp_ratio=4.0, num_classes=num_classes, global_pool="avg",
                             scale_attn_norm=sub_ln, scale_mlp_norm=sub_ln)


def plain_vision(data: Path, steps: int, warmup: int, batch_size: int = 64, seed: int = 0,
                 sub_ln: bool = False) -> float:
    """reference_vision.py's loop, timed: timm ViT (with ``sub_ln``, timm's Sub-LN blocks), AdamW,
    flips on the batch."""
    from reference_vision import load_split

    x_train, y_train, classes = load_split(data, "train")
    torch.manual_seed(seed)
    model = plain_vit(len(classes), x_train.shape[-1], sub_ln)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps)
    gen = torch.Generator().manual_seed(seed)
    stamps = []
    for step in range(1, steps + 1):
        idx = torch.randint(len(x_train), (batch_size,), generator=gen)
        x, y = x_train[idx], y_train[idx]
        flip = torch.rand(len(x), generator=gen) < 0.5
        x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % 10 == 0:
            loss.item()
            stamps.append((step, time.process_time()))
    return per_step(stamps, warmup)


def plain_speech(config: str, data: Path, steps: int, warmup: int, seed: int = 0) -> float:
    """asr_reference.py's loop, timed, on our buckets."""
    import random

    import numpy as np
    from asr_reference import Reference

    from foundation.engine.config import load_config
    from foundation.engine.model import ModelConfig, MultiTaskModel

    torch.manual_seed(seed)
    cfg, specs = load_config(ROOT / config, [f"tasks.asr.data_dir={data}"])
    task = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs)).tasks["asr"]
    stats = np.load(task.cfg.stats_path)
    mean = torch.tensor(stats["sum"] / stats["count"], dtype=torch.float32)
    std = torch.tensor(np.sqrt(stats["sum_square"] / stats["count"] - (stats["sum"] / stats["count"]) ** 2),
                       dtype=torch.float32)
    train = task.train_dataset()
    model = Reference(task.tokenizer.size, dim=cfg.backbone.dim, depth=cfg.backbone.depth, heads=cfg.backbone.heads,
                      ffn=cfg.backbone.ffn_dim, mels=task.cfg.num_mel_bins, frontend="vgg",
                      vgg_channels=tuple(task.cfg.vgg_channels))
    opt = torch.optim.AdamW(model.parameters(), 4e-3, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    order, rng, stamps = [], random.Random(seed), []
    for step in range(1, steps + 1):
        if not order:
            order = list(range(len(train)))
            rng.shuffle(order)
        b = task.collate([train[order.pop()]])
        x = (b["feats"] - mean) / std
        x = x.masked_fill(torch.arange(x.shape[1])[None, :, None] >= b["feat_lens"][:, None, None], 0.0)
        loss = model.loss(x, b["feat_lens"], b["targets"], b["target_lens"])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 10 == 0:
            loss.item()
            stamps.append((step, time.process_time()))
    return per_step(stamps, warmup)


# --------------------------------------------------------------------------- the report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/step_cost.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--tasks", default="vision,speech")
    p.add_argument("--norms", default="preln,magneto")
    p.add_argument("--vision-data", type=Path, default=Path("data/vision-demo"))
    p.add_argument("--speech-data", type=Path, default=Path("data/speech-demo"))
    p.add_argument("--steps", type=int, default=260, help="steps of each timed run")
    p.add_argument("--warmup", type=int, default=60, help="steps left out of the timing (vision: one epoch decodes "
                                                           "and caches the images)")
    p.add_argument("--rounds", type=int, default=2, help="each run this often, alternating ours and plain")
    p.add_argument("--batch-size", type=int, default=64, help="vision: images a step, both loops (the recipe's: 64)")
    p.add_argument("--out", type=Path, help="our runs' output_dir (default: a temporary folder)")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    from foundation.engine.host_memory import keep_freed_memory

    keep_freed_memory()  # as `foundation train` runs: see the docstring
    tasks = a.tasks.split(",")
    for task, folder, what in (("vision", a.vision_data, "vision"), ("speech", a.speech_data, "speech")):
        if task in tasks and not (folder / "train").is_dir():
            raise SystemExit(f"step_cost: {folder}/train: no such folder (foundation data make {what} --out {folder})")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = a.out or Path(tmp)
        for task in tasks:
            if task == "vision":
                config = "configs/vision/tiny_finetune.yaml"
                fields = ["init_from=null", f"tasks.classification.data_dir={a.vision_data}",
                          f"train.batch_size={a.batch_size}"]

                def plain(norm: str) -> float:
                    return plain_vision(a.vision_data, a.steps, a.warmup, a.batch_size, sub_ln=norm == "magneto")

                def plain_name(norm: str) -> str:
                    return f"timm ViT{', Sub-LN' if norm == 'magneto' else ''}, plain AdamW loop"
            elif task == "speech":
                config = "configs/asr/tiny.yaml"
                fields = [f"tasks.asr.data_dir={a.speech_data}", "tasks.asr.rnnt_start=0"]

                def plain(norm: str) -> float:  # one loop for both norms: torch's encoder has no Sub-LN
                    return plain_speech(config, a.speech_data, a.steps, a.warmup)

                def plain_name(norm: str) -> str:
                    return "plain PyTorch transducer loop"
            else:
                raise SystemExit(f"step_cost: --tasks: unknown {task!r} (vision, speech)")
            norms = a.norms.split(",")
            plains = {norm: plain_name(norm) for norm in norms}  # each norm's plain loop, by name
            loops: dict[str, str] = {}  # each plain loop once (speech: one for both norms), with a norm it stands for
            for norm, name in plains.items():
                loops.setdefault(name, norm)
            times: dict[str, list[float]] = {}
            for r in range(a.rounds):
                for name, norm in loops.items():
                    times.setdefault(name, []).append(plain(norm))
                for norm in norms:
                    s = ours(config, [*fields, f"backbone.norm={norm}"], out, f"{task}-{norm}", a.steps, a.warmup)
                    times.setdefault(norm, []).append(s)
                print(f"  {task} round {r + 1}: " + ", ".join(f"{k} {1000 * v[-1]:.0f} ms" for k, v in times.items()),
                      flush=True)
            for norm in norms:
                base = min(times[plains[norm]])
                if not any(row[1] == plains[norm] for row in rows if row[0] == task):
                    rows.append((task, plains[norm], base, None, None))
                parts = breakdown(config, [*fields, f"backbone.norm={norm}"])
                rows.append((task, f"ours, {norm}", min(times[norm]), min(times[norm]) / base, parts))
    print("\n| task | loop | CPU ms / step | ours / plain | ours: data alone | ours: fwd + bwd + AdamW alone |")
    print("|---|---|---|---|---|---|")
    for task, name, secs, ratio, parts in rows:
        if parts is None:
            print(f"| {task} | {name} | {1000 * secs:.0f} | 1.00 | | |")
        else:
            print(f"| {task} | {name} | {1000 * secs:.0f} | {ratio:.2f} | {1000 * parts['data']:.0f} | "
                  f"{1000 * parts['model']:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
