"""A plain reference for the VL demo: a small CNN on the image, a GRU over the question's
words, FiLM fusion, a plain PyTorch loop. Same data, splits and budget (steps x batch) as
the tiny BEiT-3 recipes, so a plateau of ours that the reference does not share points at
our pipeline or recipe, and one it shares points at the data or the budget.

    python benchmarks/vl_reference.py vqa /work/bl/data/vl/vqa --steps 250 --seed 0
    python benchmarks/vl_reference.py nlvr2 /work/bl/data/vl/nlvr2 --steps 200 --batch-size 16
    python benchmarks/vl_reference.py vqa DIR/vqa --fusion concat     # late fusion (pooled image ++ question)
    python benchmarks/vl_reference.py vqa DIR/vqa --steps 1500 --train-fraction 0.1 --seed 0 \
        --pretrain DIR/coco/annotations/captions_train2014.json --pretrain-steps 1500   # plain VL pretraining first

With ``--train-fraction`` VQA trains on the same questions as our runs with
``tasks.vqa.train_fraction`` / ``subset_seed`` (the answers from those only). ``--pretrain`` first
trains the same network on the unlabelled image-caption pairs (COCO captions json, images beside
the VQA ones) to name a masked caption word, one per caption, the scenes' colour, shape, count and
relation words first (``--mask-words``), as BEiT-3's pair MLM with content words first does ours;
then VQA starts from every weight but the output layer. The plain answer to whether pretraining
can pay on this data at this size.

Deliberately independent of the project's pipeline: its own json reading, a word-level
vocabulary of the training split (unseen words -> <unk>), PIL images scaled to [-1, 1],
AdamW with linear warmup + cosine decay. VQA: BCE on the soft scores over the majority
answers of the training split, the official accuracy (``foundation_tasks.vqa.metrics``); NLVR2: each
image through the FiLM'd CNN with the sentence, the two pooled features concatenated, a
True / False MLP. Prints accuracy on the held-out split, on its seen / held-out-template
items (the demo sets' ``is_held_out``: ``vl`` and ``vqa-shifted``), VQA by answer type (as the VQA runs log it),
and with the images permuted within the split
(a model that ignores the images scores the same).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from PIL import Image  # noqa: E402
from torch import nn  # noqa: E402

from foundation.engine.data import labelled_fraction  # noqa: E402
from foundation_tasks.vl_common import demo as home  # noqa: E402
from foundation_tasks.vqa import demo as shifted  # noqa: E402
from foundation_tasks.vqa.metrics import normalize_answer, soft_score, vqa_accuracy  # noqa: E402


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


class Vocab:
    def __init__(self, texts: list[str]):
        self.index = {"<pad>": 0, "<unk>": 1, "<mask>": 2}
        for t in texts:
            for w in words(t):
                self.index.setdefault(w, len(self.index))

    def encode(self, texts: list[str]) -> torch.Tensor:
        seqs = [[self.index.get(w, 1) for w in words(t)] or [1] for t in texts]
        out = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
        for i, s in enumerate(seqs):
            out[i, :len(s)] = torch.tensor(s)
        return out


def load_images(paths: list[Path]) -> torch.Tensor:
    arr = np.stack([np.asarray(Image.open(p).convert("RGB"), dtype=np.float32) for p in paths])
    return torch.from_numpy(arr).permute(0, 3, 1, 2) / 127.5 - 1


# --------------------------------------------------------------------------- data


def vqa_split(root: Path, split: str) -> dict:
    qs = json.loads((root / f"v2_OpenEnded_mscoco_{split}_questions.json").read_text())["questions"]
    anns = {a["question_id"]: a for a in json.loads((root / f"v2_mscoco_{split}_annotations.json").read_text())["annotations"]}
    ids = sorted({q["image_id"] for q in qs})
    row = {i: k for k, i in enumerate(ids)}
    return {"images": load_images([root / split / f"COCO_{split}_{i:012d}.jpg" for i in ids]),
            "image": torch.tensor([row[q["image_id"]] for q in qs]),
            "text": [q["question"] for q in qs],
            "answers": [[a["answer"] for a in anns[q["question_id"]]["answers"]] for q in qs],
            "majority": [normalize_answer(anns[q["question_id"]]["multiple_choice_answer"]) for q in qs],
            "answer_type": [anns[q["question_id"]].get("answer_type", "") for q in qs],
            # the demo sets mark questions in held-out wordings in their question_type (vl and vqa-shifted alike)
            "held": [anns[q["question_id"]].get("question_type", "").startswith("held-out") for q in qs]}


def nlvr2_split(root: Path, split: str) -> dict:
    recs = [json.loads(l) for l in (root / "data" / f"{split}.json").read_text().splitlines() if l.strip()]
    folder = (lambda r: root / "images" / "train" / str(r["directory"])) if split == "train" else (lambda r: root / split)
    pairs = sorted({(str(folder(r)), r["identifier"].rsplit("-", 1)[0]) for r in recs})
    row = {p[1]: k for k, p in enumerate(pairs)}
    paths = [Path(d) / f"{prefix}-img{s}.png" for d, prefix in pairs for s in (0, 1)]
    images = load_images(paths).reshape(len(pairs), 2, 3, *load_images(paths[:1]).shape[-2:])
    return {"images": images, "image": torch.tensor([row[r["identifier"].rsplit("-", 1)[0]] for r in recs]),
            "text": [r["sentence"] for r in recs], "label": torch.tensor([r["label"] == "True" for r in recs]).long()}


# --------------------------------------------------------------------------- model


class FiLMNet(nn.Module):
    """CNN (coordinates appended) whose last blocks are FiLM'd by the text's GRU state, or
    (``fusion="concat"``) a CNN pooled on its own, concatenated with the text state."""

    def __init__(self, vocab: int, out: int, dim: int = 64, fusion: str = "film"):
        super().__init__()
        self.fusion = fusion
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.gru = nn.GRU(dim, dim, batch_first=True)
        self.stem = nn.Sequential(nn.Conv2d(5, dim, 3, 2, 1), nn.BatchNorm2d(dim), nn.ReLU(),
                                  nn.Conv2d(dim, dim, 3, 2, 1), nn.BatchNorm2d(dim), nn.ReLU())
        self.blocks = nn.ModuleList(nn.Conv2d(dim + 2, dim, 3, 1, 1) for _ in range(2))
        self.norms = nn.ModuleList(nn.BatchNorm2d(dim, affine=False) for _ in range(2))
        self.film = nn.Linear(dim, 4 * dim)
        self.head = nn.Sequential(nn.Linear(dim if fusion == "film" else 2 * dim, 2 * dim), nn.ReLU(),
                                  nn.Linear(2 * dim, out))

    @staticmethod
    def coords(x: torch.Tensor) -> torch.Tensor:
        B, _, H, W = x.shape
        ys = torch.linspace(-1, 1, H).view(1, 1, H, 1).expand(B, 1, H, W)
        xs = torch.linspace(-1, 1, W).view(1, 1, 1, W).expand(B, 1, H, W)
        return torch.cat([x, xs, ys], 1)

    def text(self, ids: torch.Tensor) -> torch.Tensor:
        lengths = (ids != 0).sum(1).clamp(min=1)
        packed = nn.utils.rnn.pack_padded_sequence(self.embed(ids), lengths, batch_first=True, enforce_sorted=False)
        return self.gru(packed)[1][0]

    def features(self, images: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        x = self.stem(self.coords(images))
        film = self.film(q).view(q.shape[0], 2, 2, -1) if self.fusion == "film" else None
        for k, (conv, norm) in enumerate(zip(self.blocks, self.norms)):
            h = norm(conv(self.coords(x)))
            if film is not None:
                h = h * (1 + film[:, k, 0, :, None, None]) + film[:, k, 1, :, None, None]
            x = x + F.relu(h)
        pooled = x.amax((2, 3))
        return pooled if self.fusion == "film" else torch.cat([pooled, q], 1)

    def forward(self, images: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images, self.text(ids)))


class NLVR2Net(nn.Module):
    def __init__(self, vocab: int, dim: int = 64, fusion: str = "film"):
        super().__init__()
        self.net = FiLMNet(vocab, 2, dim, fusion)
        width = dim if fusion == "film" else 2 * dim
        self.head = nn.Sequential(nn.Linear(2 * width, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, 2))

    def forward(self, pair: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        q = self.net.text(ids)
        left, right = self.net.features(pair[:, 0], q), self.net.features(pair[:, 1], q)
        return self.head(torch.cat([left, right], 1))


# --------------------------------------------------------------------------- train / evaluate


def lr_at(step: int, steps: int, warmup: int, lr: float) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def train(a: argparse.Namespace) -> dict:
    torch.manual_seed(a.seed)
    root = Path(a.data)
    if a.task == "vqa":
        tr, va = vqa_split(root, a.train_split or "train2014"), vqa_split(root, a.eval_split or "val2014")
        texts = list(tr["text"])  # the vocabulary: every training question's words (text without answers)
        if a.train_fraction is not None:  # the label budget: our runs' rows (tasks.vqa.train_fraction / subset_seed)
            rows = labelled_fraction(len(tr["text"]), a.train_fraction, a.subset_seed, "questions")
            tr = {k: (v if k == "images" else v[torch.tensor(rows)] if torch.is_tensor(v) else [v[i] for i in rows])
                  for k, v in tr.items()}
        counts = Counter(tr["majority"])
        answers = sorted(counts, key=lambda x: (-counts[x], x))
        index = {x: i for i, x in enumerate(answers)}
        target = torch.zeros(len(tr["text"]), len(answers))
        for row, ans in enumerate(tr["answers"]):
            for x, n in Counter(normalize_answer(y) for y in ans).items():
                if x in index:
                    target[row, index[x]] = soft_score(n)
    else:
        tr, va = nlvr2_split(root, a.train_split or "train"), nlvr2_split(root, a.eval_split or "dev")
        texts = tr["text"]
    pairs = read_captions(Path(a.pretrain), Path(a.pretrain_images or root / "train2014")) if a.pretrain else None
    vocab = Vocab(texts + (pairs["text"] if pairs else []))
    tr_ids, va_ids = vocab.encode(tr["text"]), vocab.encode(va["text"])
    model = FiLMNet(len(vocab.index), len(answers), a.dim, a.fusion) if a.task == "vqa" else \
        NLVR2Net(len(vocab.index), a.dim, a.fusion)
    pretrained = pretrain(a, vocab, pairs) if pairs else None
    if pretrained is not None:
        start_from(model if a.task == "vqa" else model.net, pretrained["state"])
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(a.seed)
    start, n = time.time(), len(tr["text"])
    for step in range(a.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, a.steps, a.warmup, a.lr)
        b = torch.randint(n, (a.batch_size,), generator=g)
        logits = model(tr["images"][tr["image"][b]], tr_ids[b])
        if a.task == "vqa":
            loss = F.binary_cross_entropy_with_logits(logits, target[b], reduction="none").sum(1).mean()
        else:
            loss = F.cross_entropy(logits, tr["label"][b])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if a.log_every and (step + 1) % a.log_every == 0:
            print(f"step {step + 1}: loss {loss.item():.4f}", flush=True)
    seconds = time.time() - start

    @torch.no_grad()
    def evaluate(image_rows: torch.Tensor) -> list[float]:
        model.eval()
        out = []
        for i in range(0, len(va["text"]), 256):
            logits = model(va["images"][image_rows[i:i + 256]], va_ids[i:i + 256])
            if a.task == "vqa":
                out += [vqa_accuracy(answers[k], va["answers"][i + j]) for j, k in enumerate(logits.argmax(1).tolist())]
            else:
                out += (logits.argmax(1) == va["label"][i:i + 256]).float().tolist()
        model.train()
        return out

    scores = evaluate(va["image"])
    shuffled = evaluate(va["image"][torch.randperm(len(va["image"]), generator=torch.Generator().manual_seed(123))])
    held = va["held"] if "held" in va else [home.is_held_out(t) or shifted.is_held_out(t) for t in va["text"]]
    mean = lambda xs: 100 * sum(xs) / max(1, len(xs))  # noqa: E731
    types = {t: mean([s for s, u in zip(scores, va["answer_type"]) if u == t])
             for t in sorted(set(va.get("answer_type", [])) - {""})}
    return {"accuracy": mean(scores), "seen": mean([s for s, h in zip(scores, held) if not h]),
            "held_out": mean([s for s, h in zip(scores, held) if h]), "shuffled": mean(shuffled),
            "by_answer_type": types, "seconds": seconds, "pretrained": pretrained and pretrained["report"]}


# --------------------------------------------------------------------------- plain VL pretraining

MASK_WORDS = (*home.COLORS, *home.SHAPES, *(s + "s" for s in home.SHAPES), *home.NUMBER_WORDS,
              "left", "right", "above", "below")  # the vl demo's content words (tiny_pretrain.yaml's text_mask_words)


def read_captions(path: Path, images: Path) -> dict:
    doc = json.loads(path.read_text())
    files = {im["id"]: im["file_name"] for im in doc["images"]}
    ids = sorted(files)
    row = {i: k for k, i in enumerate(ids)}
    return {"images": load_images([images / files[i] for i in ids]),
            "image": torch.tensor([row[c["image_id"]] for c in doc["annotations"]]),
            "text": [c["caption"] for c in doc["annotations"]]}


def maskable(ids: torch.Tensor, vocab: Vocab, first: list[str]) -> torch.Tensor:
    """Per caption, the positions a mask may take: its words among ``first``, or any word if none."""
    content = torch.zeros_like(ids, dtype=torch.bool)
    for w in first:
        if w in vocab.index:
            content |= ids == vocab.index[w]
    return torch.where(content.any(1, keepdim=True), content, ids > 0).float()


def mask_one(ids: torch.Tensor, choose: torch.Tensor, g: torch.Generator, mask_id: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's copy with one word masked, drawn among ``choose``'s positions: (ids, where, the word)."""
    at = torch.multinomial(choose, 1, generator=g).squeeze(1)
    rows = torch.arange(len(ids))
    x = ids.clone()
    target = x[rows, at]
    x[rows, at] = mask_id
    return x, at, target


def start_from(net: FiLMNet, state: dict) -> list[str]:
    """Load every pretrained weight whose shape fits (all but the output layer: the answers are not
    the words); returns the names left as they were."""
    own = net.state_dict()
    fits = {k: v for k, v in state.items() if own[k].shape == v.shape}
    net.load_state_dict(fits, strict=False)
    return sorted(set(own) - set(fits))


def pretrain(a: argparse.Namespace, vocab: Vocab, pairs: dict) -> dict:
    """The network names one masked word of each caption from the image and the rest of the
    caption (a content word where the caption has one); returns its weights and what it reached."""
    ids = vocab.encode(pairs["text"])
    choose = maskable(ids, vocab, a.mask_words.split(","))
    model = FiLMNet(len(vocab.index), len(vocab.index), a.dim, a.fusion)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(a.seed + 1000)
    right, start = [], time.time()
    for step in range(a.pretrain_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, a.pretrain_steps, a.warmup, a.lr)
        b = torch.randint(len(ids), (a.batch_size,), generator=g)
        x, _, target = mask_one(ids[b], choose[b], g, vocab.index["<mask>"])
        logits = model(pairs["images"][pairs["image"][b]], x)
        loss = F.cross_entropy(logits, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        right += (logits.argmax(1) == target).tolist()
    tail = right[-100 * a.batch_size:]
    return {"state": model.state_dict(),
            "report": f"pretrained {a.pretrain_steps} steps of {a.batch_size} on {len(ids)} captions: masked word "
                      f"named {100 * sum(tail) / len(tail):.1f} % over the last 100 steps ({time.time() - start:.0f} s)"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/vl_reference.py", description=__doc__.split("\n\n")[0])
    p.add_argument("task", choices=["vqa", "nlvr2"])
    p.add_argument("data", help="the demo's vqa/ or nlvr2/ directory")
    p.add_argument("--steps", type=int, default=250)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=25)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--fusion", choices=["film", "concat"], default="film")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-split")
    p.add_argument("--eval-split")
    p.add_argument("--log-every", type=int, default=0)
    p.add_argument("--train-fraction", type=float, help="VQA: train on this fraction of the questions (as ours)")
    p.add_argument("--subset-seed", type=int, help="which fraction (default: --seed), as tasks.vqa.subset_seed")
    p.add_argument("--pretrain", help="first pretrain on these image-caption pairs (COCO captions json)")
    p.add_argument("--pretrain-images", help="their images (default: DATA/train2014)")
    p.add_argument("--pretrain-steps", type=int, default=1500)
    p.add_argument("--mask-words", default=",".join(MASK_WORDS), help="caption words masked first (comma-separated)")
    a = p.parse_args(argv)
    if a.subset_seed is None:
        a.subset_seed = a.seed
    if a.train_fraction is not None and (a.task != "vqa" or not 0 < a.train_fraction <= 1):
        p.error("--train-fraction: VQA only, in (0, 1]")
    torch.set_num_threads(1)
    r = train(a)
    print(f"{a.task} reference ({a.fusion}, {a.steps} steps of {a.batch_size}, seed {a.seed}): "
          f"accuracy {r['accuracy']:.1f} (seen {r['seen']:.1f} / held-out {r['held_out']:.1f}), "
          f"images shuffled {r['shuffled']:.1f}; {r['seconds']:.0f} s training")
    if r["pretrained"]:
        print(r["pretrained"])
    if r["by_answer_type"]:  # as the VQA runs log them (vqa_accuracy_yes_no, _number, _other)
        print("by answer type: " + ", ".join(f"{t} {v:.1f}" for t, v in r["by_answer_type"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
