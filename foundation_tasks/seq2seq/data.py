"""Generated sequence-to-sequence problems, in fairseq's raw-text layout.

A sample is a sequence of symbols 0..V-1 and its target: the sequence reversed
(``reverse``) or sorted (``sort``). Generation is a pure function of (problem, sizes,
seed). On disk a split is two line-aligned text files, ``<split>.src`` and
``<split>.tgt``, one space-separated sequence per line (fairseq's raw layout), so a
real parallel corpus of integer symbols drops in by pointing ``data_dir`` at it::

    python -m foundation_tasks.seq2seq.data data/seq2seq-reverse --problem reverse
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

PAD, BOS, EOS = 0, 1, 2
SPECIALS = 3  # symbol s is token id s + SPECIALS
PROBLEMS = ("reverse", "sort")
SPLITS = ("train", "valid")


def target_of(problem: str, source: list[int]) -> list[int]:
    return source[::-1] if problem == "reverse" else sorted(source)


def generate(problem: str, n: int, vocab_size: int, min_len: int, max_len: int, seed: int) -> list[tuple[list[int], list[int]]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        src = rng.integers(0, vocab_size, int(rng.integers(min_len, max_len + 1))).tolist()
        out.append((src, target_of(problem, src)))
    return out


def write_split(directory: Path, split: str, pairs: list[tuple[list[int], list[int]]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for side, i in (("src", 0), ("tgt", 1)):
        (directory / f"{split}.{side}").write_text("".join(" ".join(map(str, p[i])) + "\n" for p in pairs))


def read_split(directory: Path, split: str, vocab_size: int) -> list[tuple[list[int], list[int]]]:
    sides = []
    for side in ("src", "tgt"):
        path = directory / f"{split}.{side}"
        lines = path.read_text().splitlines()
        seqs = []
        for n, line in enumerate(lines, 1):
            try:
                seq = [int(tok) for tok in line.split()]
            except ValueError:
                raise ValueError(f"{path}:{n}: symbols must be integers, got {line!r}") from None
            if any(not 0 <= s < vocab_size for s in seq):
                raise ValueError(f"{path}:{n}: symbols must lie in [0, vocab_size={vocab_size})")
            seqs.append(seq)
        sides.append(seqs)
    if len(sides[0]) != len(sides[1]):
        raise ValueError(f"{directory}: {split}.src has {len(sides[0])} lines, {split}.tgt {len(sides[1])}")
    return list(zip(*sides))


class PairDataset(Dataset):
    """(source ids, target ids) as LongTensors of token ids (symbols shifted past PAD/BOS/EOS)."""

    def __init__(self, pairs: list[tuple[list[int], list[int]]]):
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        src, tgt = self.pairs[i]
        return torch.tensor(src) + SPECIALS, torch.tensor(tgt) + SPECIALS


def collate(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-padded batch: ``src``, ``dec_in`` = BOS + target, ``labels`` = target + EOS,
    and their padding masks (True = padding)."""
    B = len(samples)
    S = max(len(s) for s, _ in samples)
    T = max(len(t) for _, t in samples) + 1
    src = torch.full((B, S), PAD, dtype=torch.long)
    dec_in = torch.full((B, T), PAD, dtype=torch.long)
    labels = torch.full((B, T), PAD, dtype=torch.long)
    for i, (s, t) in enumerate(samples):
        src[i, : len(s)] = s
        dec_in[i, 0] = BOS
        dec_in[i, 1: len(t) + 1] = t
        labels[i, : len(t)] = t
        labels[i, len(t)] = EOS
    return {"src": src, "src_pad": src == PAD, "dec_in": dec_in, "dec_pad": dec_in == PAD, "labels": labels}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m foundation_tasks.seq2seq.data", description="write a generated seq2seq data set")
    p.add_argument("out", type=Path, help="directory for {train,valid}.{src,tgt}")
    p.add_argument("--problem", choices=PROBLEMS, default="reverse")
    p.add_argument("--vocab-size", type=int, default=16)
    p.add_argument("--min-len", type=int, default=4)
    p.add_argument("--max-len", type=int, default=12)
    p.add_argument("--train-size", type=int, default=5000)
    p.add_argument("--valid-size", type=int, default=500)
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args(argv)
    for split, n, seed in (("train", a.train_size, a.seed), ("valid", a.valid_size, a.seed + 1)):
        write_split(a.out, split, generate(a.problem, n, a.vocab_size, a.min_len, a.max_len, seed))
    print(f"wrote {a.out}/{{train,valid}}.{{src,tgt}} ({a.train_size} + {a.valid_size} {a.problem} pairs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
