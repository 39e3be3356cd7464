"""Masking for masked data modeling (BEiT-3): block-wise masking of image patches (BEiT's
algorithm, ``foundation_tasks.vision_common.masking.MaskingGenerator``, shared with the vision MIM task) and
BERT-style masking of text tokens. Both draw from a ``numpy.random.Generator`` that the
caller seeds per item.
"""
from __future__ import annotations

import numpy as np

from foundation_tasks.vision_common.masking import MaskingGenerator


def block_masking(grid: tuple[int, int], ratio: float, min_block: int | None = None) -> MaskingGenerator:
    """BEiT's block-wise masking of ``round(ratio * patches)`` patches (never more; a few
    fewer when no block fits after 10 tries). Blocks have at least ``min_block`` patches:
    BEiT's 16 on a 14 x 14 grid, by default ``min(16, masked // 4)`` on smaller grids."""
    if not 0.0 < ratio < 1.0:
        raise ValueError(f"mask ratio must be in (0, 1), got {ratio}")
    target = max(1, int(round(ratio * grid[0] * grid[1])))
    min_block = min_block if min_block is not None else max(1, min(16, target // 4))
    return MaskingGenerator(tuple(grid), target, min(min_block, target))


def mask_text(ids: list[int], ratio: float, rng: np.random.Generator, *, mask_id: int, vocab: tuple[int, int],
              special: tuple[int, ...], prefer: frozenset[int] = frozenset()) -> tuple[list[int], list[bool]]:
    """BERT's masking of ``round(ratio * pieces)`` (at least one) of the pieces (``ids``
    without bos / eos): each becomes ``mask_id`` (80%), a random id from ``vocab`` =
    [low, high) other than ``special`` (10%), or stays (10%). Returns (input ids, masked).

    Pieces whose id is in ``prefer`` are chosen first (in random order), the rest of the
    ``round(ratio * pieces)`` at random among the others: the content-word masking of Bitton
    et al. 2021, which masks what the image shows rather than words the sentence alone gives.
    With ``prefer`` empty the draws are exactly BERT's."""
    pieces = [i for i, t in enumerate(ids) if t not in special]
    if not pieces:
        return list(ids), [False] * len(ids)
    n = min(len(pieces), max(1, int(round(ratio * len(pieces)))))
    if prefer:
        first = [i for i in pieces if ids[i] in prefer]
        rest = [i for i in pieces if ids[i] not in prefer]
        first = list(rng.permutation(first)) if first else []
        chosen = first[:n] + (list(rng.choice(rest, n - len(first), replace=False)) if n > len(first) else [])
    else:
        chosen = rng.choice(pieces, n, replace=False)
    out, masked = list(ids), [False] * len(ids)
    for i in chosen:
        masked[i] = True
        r = rng.random()
        if r < 0.8:
            out[i] = mask_id
        elif r < 0.9:
            t = int(rng.integers(*vocab))
            while t in special:
                t = int(rng.integers(*vocab))
            out[i] = t
    return out, masked
