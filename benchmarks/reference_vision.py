"""A plain timm ViT on the vision demo data, beside the project's tiny recipe at the same budget.

    python benchmarks/reference_vision.py                                  # timm ViT, then ours (Magneto)
    python benchmarks/reference_vision.py backbone.norm=preln              # ours with Pre-LN
    python benchmarks/reference_vision.py --steps 1200 --seed 1 --no-ours  # the reference alone
    python benchmarks/reference_vision.py --ours-run runs/x/vision-ft      # compare with a finished run

The reference is deliberately plain and independent of the project's pipeline: torchvision's
``ImageFolder`` (its own label order), ``timm.create_model`` (a ViT of the tiny recipe's size:
64 dim, 4 blocks, 2 heads, patch 4, mean pooling), random horizontal flips only, AdamW with
a one-cycle schedule, cross-entropy, and top-1 on the whole val split. "Ours" is the tiny
config trained from scratch through ``foundation train`` (the engine, our data pipeline and
augmentation) for the same number of steps and batch size. Both print top-1 on the same
held-out split, so a recipe or pipeline that falls behind a plain ViT shows at once.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def load_split(root: Path, split: str) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """All images of one split as one normalised tensor (the demo sets are a few MB)."""
    from timm.data.constants import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
    from torchvision import datasets, transforms

    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize(IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)])
    ds = datasets.ImageFolder(str(root / split), transform=tf)
    images = torch.stack([ds[i][0] for i in range(len(ds))])
    return images, torch.tensor(ds.targets), ds.classes


@torch.no_grad()
def top1(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, batch: int = 500) -> float:
    model.eval()
    correct = sum(int((model(images[i:i + batch]).argmax(-1) == labels[i:i + batch]).sum())
                  for i in range(0, len(images), batch))
    model.train()
    return correct / len(images)


def train_reference(a: argparse.Namespace) -> dict:
    """timm's ViT, a plain AdamW loop, flips only."""
    import timm

    root = Path(a.data)
    x_train, y_train, classes = load_split(root, "train")
    x_val, y_val, val_classes = load_split(root, "val")
    if classes != val_classes:
        raise SystemExit(f"reference_vision: {root}/train and {root}/val have different class folders")
    torch.manual_seed(a.seed)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=x_train.shape[-1], patch_size=4,
                              embed_dim=a.dim, depth=a.depth, num_heads=a.heads, mlp_ratio=4.0,
                              num_classes=len(classes), global_pool="avg")
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=a.steps)
    gen = torch.Generator().manual_seed(a.seed)
    curve, start = [], time.perf_counter()
    for step in range(1, a.steps + 1):
        idx = torch.randint(len(x_train), (a.batch_size,), generator=gen)
        x, y = x_train[idx], y_train[idx]
        flip = torch.rand(len(x), generator=gen) < 0.5
        x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % a.eval_every == 0 or step == a.steps:
            curve.append((step, top1(model, x_val, y_val)))
            print(f"  timm ViT step {step}: loss {loss.item():.3f}, val top-1 {100 * curve[-1][1]:.1f} %", flush=True)
    return {"top1": curve[-1][1], "curve": curve, "seconds": time.perf_counter() - start}


def train_ours(a: argparse.Namespace) -> dict:
    """The project's recipe from scratch through the engine, same steps and batch size."""
    from foundation.engine.config import load_config
    from foundation.engine.loop import train

    name = f"reference-vision-{Path(a.config).stem}-s{a.seed}"
    overrides = ["init_from=null", f"train.steps={a.steps}", f"train.batch_size={a.batch_size}", f"seed={a.seed}",
                 f"tasks.classification.data_dir={a.data}", f"output_dir={a.out}", f"run_name={name}",
                 "overwrite=true", "log.progress=false", *a.override]
    start = time.perf_counter()
    cfg, specs = load_config(a.config, overrides)
    result = train(cfg, specs)
    if result.status != "finished":
        raise SystemExit(f"reference_vision: our run ended {result.status}: {result.message}")
    return {**read_run(result.run_dir), "seconds": time.perf_counter() - start}


def read_run(run_dir: str | Path) -> dict:
    """Final top-1 and the eval curve of a classification run directory."""
    from studies.runs import eval_series, last_eval, read_records

    path = Path(run_dir) / "metrics.jsonl"
    try:
        records = read_records(run_dir, required=True)
    except FileNotFoundError:
        raise SystemExit(f"reference_vision: {path}: no such file (expected a foundation train run directory)") from None
    key = next((k for k in last_eval(records)[1] if k.endswith("/top1")), None)
    if key is None:
        raise SystemExit(f"reference_vision: {path} holds no eval/.../top1")
    curve = list(zip(*eval_series(records, key)))
    return {"top1": curve[-1][1], "curve": curve, "run_dir": str(run_dir)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/reference_vision.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/vision-demo", help="ImageNet-layout folder (foundation data make vision)")
    p.add_argument("--config", default="configs/vision/tiny_finetune.yaml", help="our recipe")
    p.add_argument("--steps", type=int, default=None, help="default: the config's train.steps")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=2e-3, help="reference: AdamW peak lr (one-cycle)")
    p.add_argument("--weight-decay", type=float, default=0.05, help="reference: AdamW weight decay")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--eval-every", type=int, default=300, help="reference: steps between val evaluations")
    p.add_argument("--out", default="runs/reference-vision", help="our run's output_dir")
    p.add_argument("--no-ours", action="store_true", help="train the reference only")
    p.add_argument("--ours-run", help="read our top-1 from this finished run directory instead of training")
    p.add_argument("override", nargs="*", help="extra key=value overrides for our run")
    a = p.parse_args(argv)
    if not (Path(a.data) / "train").is_dir():
        raise SystemExit(f"reference_vision: {a.data}/train: no such folder (foundation data make vision --out {a.data})")
    if a.steps is None:
        from foundation.engine.config import load_config

        a.steps = load_config(a.config, ["init_from=null"])[0].train.steps
    torch.set_num_threads(1)
    print(f"timm ViT ({a.dim} dim, {a.depth} blocks, patch 4), AdamW {a.lr:g} one-cycle, flips only, "
          f"{a.steps} steps x {a.batch_size}, seed {a.seed}:", flush=True)
    ref = train_reference(a)
    ours = None
    if a.ours_run:
        ours = read_run(a.ours_run)
    elif not a.no_ours:
        print(f"ours: {a.config} init_from=null, {a.steps} steps x {a.batch_size}, seed {a.seed}:", flush=True)
        ours = train_ours(a)
    print(f"\n| model | val top-1 % | train time |\n|---|---|---|\n"
          f"| timm ViT, AdamW one-cycle, flips only | {100 * ref['top1']:.1f} | {ref['seconds']:.0f} s |")
    if ours is not None:
        secs = f"{ours['seconds']:.0f} s" if "seconds" in ours else "-"
        print(f"| ours: {ours.get('run_dir') or a.config} | {100 * ours['top1']:.1f} | {secs} |")
        print(f"ours - reference: {100 * (ours['top1'] - ref['top1']):+.1f} points")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
