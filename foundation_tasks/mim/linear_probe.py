"""Linear probe: how linearly separable are a frozen backbone's features?

    python -m foundation_tasks.mim.linear_probe checkpoints/vision-mim-tiny-magneto/best/model.safetensors \\
        --data data/vision-demo --img-size 32 --patch-size 4

Mean-pooled patch tokens of the frozen backbone (its final LayerNorm included) for every
train and val image (no augmentation), then a softmax regression on them (full-batch
AdamW); prints val top-1. ``--random`` probes the same architecture at initialisation,
the baseline a pretraining has to beat. A diagnostic for the pretraining itself,
independent of any fine-tuning recipe.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from foundation.transformer import Backbone
from foundation.embed import ViTFrontEnd
from foundation_tasks.vision_common.folder import ImageFolderDataset
from foundation_tasks.vision_common.front_end import vision_encoder
from foundation_tasks.vision_common.transforms import uncropped_eval_transform


@torch.no_grad()
def features(embed: ViTFrontEnd, backbone: Backbone, ds: ImageFolderDataset, batch: int = 250):
    xs, ys = [], []
    for i in range(0, len(ds), batch):
        items = [ds[j] for j in range(i, min(i + batch, len(ds)))]
        images = torch.stack([x for x, _ in items])
        tokens = embed.embed(images)[0]
        xs.append(backbone(tokens, segments=[("vision", tokens.shape[1])])[:, 1:].mean(1))
        ys.append(torch.tensor([y for _, y in items]))
    return torch.cat(xs), torch.cat(ys)


def probe(train, val, num_classes: int, steps: int = 500, lr: float = 1e-2) -> float:
    (x, y), (xv, yv) = train, val
    mean, std = x.mean(0), x.std(0) + 1e-6
    x, xv = (x - mean) / std, (xv - mean) / std
    linear = torch.nn.Linear(x.shape[1], num_classes)
    opt = torch.optim.AdamW(linear.parameters(), lr=lr, weight_decay=1e-4)
    for _ in range(steps):
        loss = F.cross_entropy(linear(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        return float((linear(xv).argmax(-1) == yv).float().mean())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m foundation_tasks.mim.linear_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a run's model.safetensors (MIM, tokenizer or classification)")
    p.add_argument("--data", required=True)
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--patch-size", type=int, default=16)
    p.add_argument("--random", action="store_true", help="probe the architecture at initialisation instead")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    torch.manual_seed(a.seed)
    embed, backbone = vision_encoder(a.checkpoint, a.img_size, a.patch_size, load=not a.random)
    backbone.eval()
    transform = uncropped_eval_transform(a.img_size)
    train = ImageFolderDataset(a.data, "train", transform)
    val = ImageFolderDataset(a.data, "val", transform, classes=train.classes)
    acc = probe(features(embed, backbone, train), features(embed, backbone, val), len(train.classes))
    print(f"linear probe top-1 {100 * acc:.1f} ({'random init' if a.random else a.checkpoint})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
