"""A plain masked autoencoder on the vision demo data, then fine-tuning at label budgets:
the reference that our MIM pipeline's gain over scratch is measured against.

    foundation data make vision --out data/vision-demo
    python benchmarks/reference_mae.py                          # MAE 3000 steps, then 10 / 100 per class, all
    python benchmarks/reference_mae.py --per-class 10 --seeds 0 1 --pretrain-steps 6000

Deliberately plain and independent of the project's engine: torchvision's ``ImageFolder``,
``timm.create_model`` (a ViT of the tiny recipe's size: 64 dim, 4 blocks, 2 heads, patch 4,
mean pooling), MAE as He et al. 2022 (75 % of the patches dropped at random, the encoder on
the visible ones, a 2-block decoder of width 64 with mask tokens, loss on the masked
patches' per-patch normalised pixels, fixed 2-D sin-cos positions), random horizontal
flips, AdamW, a plain loop. Fine-tuning trains the same ViT from the MAE encoder or from
scratch on the same labelled subset (``labelled_subset``: the images per class our
``train_per_class`` picks for that seed) and reports top-1 on the whole val split, which
never changes with the budget.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402


def load_split(root: Path, split: str, per_class: int | None = None, seed: int = 0):
    """(images, labels) of one split as tensors, normalised; ``per_class``: the labelled subset."""
    from timm.data.constants import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
    from torchvision import datasets, transforms

    from foundation_tasks.vision_common.folder import labelled_subset

    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize(IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)])
    ds = datasets.ImageFolder(str(root / split), transform=tf)
    if per_class is not None:
        ds.samples = labelled_subset([(Path(p), y) for p, y in ds.samples], per_class, seed)
    images = torch.stack([ds[i][0] for i in range(len(ds.samples))])
    return images, torch.tensor([y for _, y in ds.samples])


def vit(a: argparse.Namespace, num_classes: int, img_size: int) -> nn.Module:
    import timm

    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=img_size, patch_size=4,
                             embed_dim=a.dim, depth=a.depth, num_heads=a.heads, mlp_ratio=4.0,
                             num_classes=num_classes, global_pool="avg")


def sincos(dim: int, side: int) -> torch.Tensor:
    """(side*side, dim) fixed 2-D sin-cos positions (MAE)."""
    from timm.layers import build_sincos2d_pos_embed

    return build_sincos2d_pos_embed([side, side], dim)


class MAE(nn.Module):
    def __init__(self, encoder: nn.Module, patch: int, side: int, decoder_dim: int = 64, decoder_depth: int = 2):
        from timm.models.vision_transformer import Block

        super().__init__()
        self.encoder, self.patch, self.side = encoder, patch, side
        dim = encoder.embed_dim
        with torch.no_grad():  # MAE's fixed positions in the encoder (its fine-tuning keeps them, learned)
            encoder.pos_embed[:, 1:] = sincos(dim, side)
            encoder.pos_embed[:, :1] = 0
        self.embed = nn.Linear(dim, decoder_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_dim))
        nn.init.normal_(self.mask_token, std=0.02)
        self.register_buffer("decoder_pos", sincos(decoder_dim, side)[None])
        self.blocks = nn.Sequential(*[Block(decoder_dim, 2, 4.0, qkv_bias=True) for _ in range(decoder_depth)])
        self.norm = nn.LayerNorm(decoder_dim)
        self.pred = nn.Linear(decoder_dim, patch * patch * 3)

    def targets(self, images: torch.Tensor) -> torch.Tensor:
        b, c, h, w = images.shape
        p = self.patch
        t = images.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1).reshape(b, -1, p * p * c)
        return (t - t.mean(-1, keepdim=True)) / (t.var(-1, keepdim=True) + 1e-6).sqrt()

    def forward(self, images: torch.Tensor, ratio: float, gen: torch.Generator) -> torch.Tensor:
        e = self.encoder
        x = e.patch_embed(images) + e.pos_embed[:, 1:]
        b, n, d = x.shape
        keep = int(n * (1 - ratio))
        order = torch.rand(b, n, generator=gen).argsort(1)
        visible = order[:, :keep]
        x = torch.gather(x, 1, visible[..., None].expand(-1, -1, d))
        x = torch.cat([(e.cls_token + e.pos_embed[:, :1]).expand(b, -1, -1), x], 1)
        x = e.norm(e.blocks(x))[:, 1:]
        y = self.mask_token.expand(b, n, -1).clone()
        y.scatter_(1, visible[..., None].expand(-1, -1, y.shape[-1]), self.embed(x))
        y = self.pred(self.norm(self.blocks(y + self.decoder_pos)))
        masked = torch.ones(b, n, dtype=torch.bool)
        masked.scatter_(1, visible, False)
        return F.mse_loss(y[masked], self.targets(images)[masked])


def flips(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    flip = torch.rand(len(x), generator=gen) < 0.5
    return torch.where(flip[:, None, None, None], x.flip(-1), x)


def pretrain(a: argparse.Namespace, x_train: torch.Tensor, num_classes: int) -> tuple[nn.Module, float]:
    torch.manual_seed(a.seed)
    encoder = vit(a, num_classes, x_train.shape[-1])
    mae = MAE(encoder, 4, x_train.shape[-1] // 4)
    opt = torch.optim.AdamW(mae.parameters(), lr=a.pretrain_lr, betas=(0.9, 0.95), weight_decay=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.pretrain_lr, total_steps=a.pretrain_steps, pct_start=0.05)
    gen, start = torch.Generator().manual_seed(a.seed), time.perf_counter()
    for step in range(1, a.pretrain_steps + 1):
        x = flips(x_train[torch.randint(len(x_train), (a.batch_size,), generator=gen)], gen)
        loss = mae(x, a.mask_ratio, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % 500 == 0 or step == a.pretrain_steps:
            print(f"  MAE step {step}: loss {loss.item():.3f}", flush=True)
    return encoder, time.perf_counter() - start


@torch.no_grad()
def top1(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch: int = 500) -> float:
    model.eval()
    correct = sum(int((model(images[i:i + batch]).argmax(-1) == labels[i:i + batch]).sum())
                  for i in range(0, len(images), batch))
    model.train()
    return correct / len(images)


def finetune(a, model: nn.Module, x: torch.Tensor, y: torch.Tensor, x_val, y_val, seed: int) -> float:
    torch.manual_seed(seed)
    model.head.reset_parameters()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=a.steps)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(a.steps):
        idx = torch.randint(len(x), (a.batch_size,), generator=gen)
        loss = F.cross_entropy(model(flips(x[idx], gen)), y[idx], label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    return top1(model, x_val, y_val)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/reference_mae.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/vision-demo")
    p.add_argument("--per-class", type=int, nargs="+", default=[10, 100, 0], help="label budgets (0 = all)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="subset and fine-tuning seeds")
    p.add_argument("--seed", type=int, default=0, help="pretraining seed")
    p.add_argument("--pretrain-steps", type=int, default=3000)
    p.add_argument("--pretrain-lr", type=float, default=1.5e-3)
    p.add_argument("--mask-ratio", type=float, default=0.75)
    p.add_argument("--steps", type=int, default=500, help="fine-tuning steps at every budget")
    p.add_argument("--lr", type=float, default=1e-3, help="fine-tuning peak lr (one-cycle)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=2)
    a = p.parse_args(argv)
    root = Path(a.data)
    if not (root / "train").is_dir():
        raise SystemExit(f"reference_mae: {root}/train: no such folder (foundation data make vision --out {root})")
    torch.set_num_threads(1)
    x_all, y_all = load_split(root, "train")
    x_val, y_val = load_split(root, "val")
    classes = int(y_all.max()) + 1
    print(f"MAE: {a.pretrain_steps} steps x {a.batch_size} on the {len(x_all)} training images (labels unused)", flush=True)
    encoder, seconds = pretrain(a, x_all, classes)
    rows = []
    for per_class in a.per_class:
        for seed in a.seeds:
            x, y = load_split(root, "train", per_class or None, seed)
            scratch = finetune(a, vit(a, classes, x.shape[-1]), x, y, x_val, y_val, seed)
            pre = finetune(a, copy.deepcopy(encoder), x, y, x_val, y_val, seed)
            rows.append((per_class or "all", seed, scratch, pre))
            print(f"  {per_class or 'all'} per class, seed {seed}: scratch {100 * scratch:.1f}, "
                  f"MAE {100 * pre:.1f} % top-1", flush=True)
    print(f"\nplain MAE reference ({seconds:.0f} s pretraining), fine-tuning {a.steps} steps x {a.batch_size}:\n")
    print("| labels per class | seed | scratch top-1 % | from MAE top-1 % | gain |\n|---|---|---|---|---|")
    for per_class, seed, scratch, pre in rows:
        print(f"| {per_class} | {seed} | {100 * scratch:.1f} | {100 * pre:.1f} | {100 * (pre - scratch):+.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
