"""What do MIM's targets teach? The visual tokens of a tokenizer, held against the label.

    python benchmarks/mim_targets.py runs/vision-tokenizer-tiny/best/model.safetensors --data data/vision-demo

BEiT's fine-tuning gain rests on its targets: predicting a masked patch's visual token only
teaches the backbone what the token carries. This prints, on the train / val splits of an
ImageNet-layout folder (no augmentation):

* the codes the tokenizer uses and their perplexity;
* how much of a patch's mean colour its code explains (val R^2 of "the code's mean colour");
* how well a plain logistic regression finds the image's class from the grid of codes
  (one-hot per position), from the bag of codes, and from the raw pixels (the ceiling of what
  a linear model can read from the image itself).

A grid-of-codes accuracy far below the raw pixels' says the tokens lost what the label needs,
and a MIM on them cannot be expected to help the fine-tuning (docs/vision.md). Uses
scikit-learn's LogisticRegression; nothing here trains a network.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import numpy as np  # noqa: E402
import torch  # noqa: E402


def images(folder: str, split: str, size: int, classes=None):
    from foundation_tasks.vision_common.folder import ImageFolderDataset
    from foundation_tasks.vision_common.transforms import uncropped_eval_transform

    ds = ImageFolderDataset(folder, split, uncropped_eval_transform(size), classes=classes)
    xs, ys = zip(*(ds[i] for i in range(len(ds))))
    return ds.classes, torch.stack(xs), np.asarray(ys)


def patch_means(x: torch.Tensor, patch: int) -> np.ndarray:
    """(B, 3, H, W) -> (B * patches, 3): each patch's mean (normalised) colour, row-major."""
    p = x.unfold(2, patch, patch).unfold(3, patch, patch).mean((-1, -2))
    return p.permute(0, 2, 3, 1).reshape(-1, 3).numpy()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/mim_targets.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("tokenizer", help="a vq_tokenizer run's model.safetensors")
    ap.add_argument("--data", required=True, help="ImageNet layout: DATA/{train,val}/<class>/*")
    a = ap.parse_args(argv)
    from sklearn.linear_model import LogisticRegression

    from foundation_tasks.vision_common.tokenizer import load_tokenizer

    try:
        tok = load_tokenizer(a.tokenizer)
        classes, xtr, ytr = images(a.data, "train", tok.img_size)
        _, xva, yva = images(a.data, "val", tok.img_size, classes)
    except (OSError, ValueError) as e:  # a missing / unreadable tokenizer file or data folder: one line
        print(f"mim_targets: error: {e}", file=sys.stderr)
        return 2
    with torch.no_grad():
        ctr, cva = (torch.cat([tok(x[i:i + 250]) for i in range(0, len(x), 250)]) for x in (xtr, xva))
    k = tok.num_codes
    used = torch.bincount(ctr.flatten(), minlength=k)
    p = used[used > 0].double() / used.sum()
    print(f"codes used {int((used > 0).sum())} of {k}, perplexity {float(torch.exp(-(p * p.log()).sum())):.1f}")

    colour_tr, colour_va = patch_means(xtr, tok.patch_size), patch_means(xva, tok.patch_size)
    code_tr, code_va = ctr.flatten().numpy(), cva.flatten().numpy()
    mean_of = np.zeros((k, 3))
    for c in np.unique(code_tr):
        mean_of[c] = colour_tr[code_tr == c].mean(0)
    residual = ((colour_va - mean_of[code_va]) ** 2).sum()
    total = ((colour_va - colour_va.mean(0)) ** 2).sum()
    print(f"patch mean colour explained by its code (val R^2): {1 - residual / total:.3f}")

    def one_hot(codes: torch.Tensor) -> np.ndarray:
        return torch.nn.functional.one_hot(codes, k).reshape(len(codes), -1).float().numpy()

    def bag(codes: torch.Tensor) -> np.ndarray:
        return np.stack([np.bincount(row, minlength=k) for row in codes.numpy()])

    inputs = {"grid of codes (one-hot per position)": (one_hot(ctr), one_hot(cva)),
              "bag of codes": (bag(ctr), bag(cva)),
              "raw pixels": (xtr.flatten(1).numpy(), xva.flatten(1).numpy())}
    print(f"class from ... (logistic regression, val top-1; {len(classes)} classes, chance {100 / len(classes):.1f}):")
    for name, (tr, va) in inputs.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # lbfgs' iteration-limit warning: the score is what we read
            clf = LogisticRegression(max_iter=300).fit(tr, ytr)
        print(f"  {name}: {100 * clf.score(va, yva):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
