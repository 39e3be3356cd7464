"""BEiT's block-wise masking (Bao et al. 2022, Algorithm 1).

Blocks are drawn until ``num_masking_patches`` patches are masked: each block has an
area of at least ``min_num_patches`` patches (fewer only when fewer remain to be
masked) and an aspect ratio (rows / columns) log-uniform in ``[min_aspect, max_aspect]``
(``max_aspect`` defaults to ``1 / min_aspect``); a block may overlap earlier ones, but
never adds more than ``max_num_patches`` nor more than are still to be masked, so the
count never overshoots. BEiT's defaults on a 14 x 14 grid: 75 patches, blocks of >= 16,
aspect 0.3 .. 1/0.3.

Integer block sides are ``round(sqrt(area * aspect))`` x ``round(sqrt(area / aspect))``;
a draw whose rounded sides break the area or aspect bounds is redrawn, so every block
obeys them exactly. After ``attempts`` failed draws in a row the mask is returned as it
is (this happens only when the bounds leave almost no room, e.g. a nearly full grid).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np


class Block(NamedTuple):
    top: int
    left: int
    height: int
    width: int
    added: int  # patches this block masked that were not masked before
    budget: int  # patches it was allowed to add


@dataclass
class MaskingGenerator:
    grid: tuple[int, int] = (14, 14)
    num_masking_patches: int = 75
    min_num_patches: int = 16
    max_num_patches: Optional[int] = None  # per block; default num_masking_patches
    min_aspect: float = 0.3
    max_aspect: Optional[float] = None  # default 1 / min_aspect
    attempts: int = 10

    def __post_init__(self) -> None:
        self.grid = (int(self.grid[0]), int(self.grid[1]))
        h, w = self.grid
        if self.max_aspect is None:
            self.max_aspect = 1.0 / self.min_aspect
        if self.max_num_patches is None:
            self.max_num_patches = self.num_masking_patches
        if not 0 < self.num_masking_patches <= h * w:
            raise ValueError(f"num_masking_patches must be in [1, {h * w}] for a {h}x{w} grid "
                             f"(got {self.num_masking_patches})")
        if not 1 <= self.min_num_patches <= self.max_num_patches:
            raise ValueError(f"min_num_patches must be in [1, max_num_patches={self.max_num_patches}] "
                             f"(got {self.min_num_patches})")
        if not 0 < self.min_aspect <= self.max_aspect:
            raise ValueError(f"aspect ratios must satisfy 0 < min_aspect <= max_aspect "
                             f"(got {self.min_aspect}, {self.max_aspect})")

    def blocks(self, rng: np.random.Generator) -> tuple[np.ndarray, list[Block]]:
        """(mask (H, W) bool, the blocks in the order drawn)."""
        H, W = self.grid
        mask = np.zeros((H, W), dtype=bool)
        drawn: list[Block] = []
        count = 0
        log_lo, log_hi = math.log(self.min_aspect), math.log(self.max_aspect)
        # ``lo + (hi - lo) * rng.random()`` is numpy's own ``rng.uniform(lo, hi)``, draw for draw, at a
        # third of its cost: masks are drawn per item on the training loop's core, and patch-wise MAE
        # masking tries ~90 blocks a mask
        random, integers = rng.random, rng.integers
        while count < self.num_masking_patches:
            budget = min(self.num_masking_patches - count, self.max_num_patches)
            lo = min(self.min_num_patches, budget)
            area_span = max(self.min_num_patches, budget) - lo
            for _ in range(self.attempts):
                area = lo + area_span * random()
                aspect = math.exp(log_lo + (log_hi - log_lo) * random())
                h, w = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
                if not (1 <= h <= H and 1 <= w <= W and h * w >= lo
                        and self.min_aspect <= h / w <= self.max_aspect):
                    continue
                top, left = int(integers(0, H - h + 1)), int(integers(0, W - w + 1))
                if h * w == 1:
                    added = 0 if mask[top, left] else 1
                else:
                    added = h * w - int(np.count_nonzero(mask[top: top + h, left: left + w]))
                if 0 < added <= budget:
                    mask[top: top + h, left: left + w] = True
                    drawn.append(Block(top, left, h, w, added, budget))
                    count += added
                    break
            else:
                break
        return mask, drawn

    def __call__(self, rng: np.random.Generator) -> np.ndarray:
        """A (H, W) bool mask, True = masked."""
        return self.blocks(rng)[0]

    def __repr__(self) -> str:
        return (f"MaskingGenerator({self.grid[0]}x{self.grid[1]}, {self.num_masking_patches} patches, blocks "
                f"{self.min_num_patches}..{self.max_num_patches}, aspect {self.min_aspect:.3g}..{self.max_aspect:.3g})")
