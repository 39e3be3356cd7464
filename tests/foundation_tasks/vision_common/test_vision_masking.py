"""BEiT's block-wise masking generator: its statistics match its parameters."""
from __future__ import annotations

import math

import numpy as np
import pytest

from foundation_tasks.vision_common.masking import MaskingGenerator


def stats(gen: MaskingGenerator, n: int = 400, seed: int = 0):
    rng = np.random.default_rng(seed)
    counts, blocks = [], []
    for _ in range(n):
        mask, drawn = gen.blocks(rng)
        counts.append(int(mask.sum()))
        assert sum(b.added for b in drawn) == mask.sum()  # blocks account for every masked patch
        blocks.extend(drawn)
    return np.array(counts), blocks


@pytest.mark.parametrize("grid,num,min_num,max_num,min_aspect,max_aspect", [
    ((14, 14), 75, 16, None, 0.3, None),  # BEiT's defaults
    ((8, 8), 26, 4, None, 0.3, None),  # the tiny configs
    ((12, 10), 40, 6, 12, 0.5, 1.5),  # non-square grid, capped blocks, asymmetric aspect range
])
def test_masking_statistics_match_parameters(grid, num, min_num, max_num, min_aspect, max_aspect):
    gen = MaskingGenerator(grid, num, min_num, max_num, min_aspect, max_aspect)
    max_num = max_num or num
    max_aspect = max_aspect or 1 / min_aspect
    counts, blocks = stats(gen)
    # count: never more than asked, almost always exactly that
    assert counts.max() <= num
    assert counts.mean() >= 0.97 * num and (counts == num).mean() >= 0.6
    for b in blocks:
        assert 0 <= b.top and b.top + b.height <= grid[0] and 0 <= b.left and b.left + b.width <= grid[1]
        # block size: at least min_num patches unless fewer were left to mask; never past the cap
        assert b.height * b.width >= min(min_num, b.budget)
        assert 0 < b.added <= min(b.budget, max_num)
        # aspect ratio (rows / columns) within the range
        assert min_aspect - 1e-9 <= b.height / b.width <= max_aspect + 1e-9
    # aspect ratios spread over the range, log-uniformly: both halves are used
    logs = np.log([b.height / b.width for b in blocks])
    mid = (math.log(min_aspect) + math.log(max_aspect)) / 2
    assert 0.3 < (logs < mid).mean() < 0.7
    assert logs.min() < mid - 0.3 * (math.log(max_aspect) - mid) and logs.max() > mid + 0.3 * (math.log(max_aspect) - mid)
    # blocks, not scattered patches: most blocks are bigger than min_num alone would force
    assert np.mean([b.height * b.width for b in blocks]) >= min_num


def test_masking_is_deterministic_and_shaped():
    gen = MaskingGenerator()
    a, b = gen(np.random.default_rng(7)), gen(np.random.default_rng(7))
    assert a.shape == (14, 14) and a.dtype == bool and np.array_equal(a, b)
    assert not np.array_equal(a, gen(np.random.default_rng(8)))
    assert "14x14, 75 patches" in repr(gen)


@pytest.mark.parametrize("kwargs,message", [
    (dict(num_masking_patches=0), "num_masking_patches must be in"),
    (dict(num_masking_patches=200), "num_masking_patches must be in"),
    (dict(min_num_patches=80), "min_num_patches must be in"),
    (dict(min_aspect=2.0, max_aspect=1.0), "aspect ratios"),
])
def test_masking_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MaskingGenerator(**kwargs)


def plain_algorithm_1(gen: MaskingGenerator, rng: np.random.Generator) -> np.ndarray:
    """The algorithm as the module docstring states it, with numpy's own uniform and a slice sum."""
    H, W = gen.grid
    mask, count = np.zeros((H, W), dtype=bool), 0
    while count < gen.num_masking_patches:
        budget = min(gen.num_masking_patches - count, gen.max_num_patches)
        lo = min(gen.min_num_patches, budget)
        for _ in range(gen.attempts):
            area = rng.uniform(lo, max(gen.min_num_patches, budget))
            aspect = math.exp(rng.uniform(math.log(gen.min_aspect), math.log(gen.max_aspect)))
            h, w = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
            if not (1 <= h <= H and 1 <= w <= W and h * w >= lo and gen.min_aspect <= h / w <= gen.max_aspect):
                continue
            top, left = int(rng.integers(0, H - h + 1)), int(rng.integers(0, W - w + 1))
            added = int(h * w - mask[top: top + h, left: left + w].sum())
            if 0 < added <= budget:
                mask[top: top + h, left: left + w] = True
                count += added
                break
        else:
            break
    return mask


@pytest.mark.parametrize("args", [
    ((8, 8), 48, 1, 1),  # the pixel MIM's patch-wise masking: ~90 draws a mask
    ((14, 14), 75, 16),  # BEiT's defaults
    ((6, 10), 30, 2, 5, 0.5, 3.0),
])
def test_masks_are_those_of_the_plain_algorithm_draw_for_draw(args):
    # the generator draws its uniforms as lo + (hi - lo) * rng.random(), faster than rng.uniform: the same
    # masks and the same generator state after them, so runs keep their masks
    gen = MaskingGenerator(*args)
    for seed in range(200):
        ours, plain = np.random.default_rng([seed, 1]), np.random.default_rng([seed, 1])
        assert np.array_equal(gen(ours), plain_algorithm_1(gen, plain)), seed
        assert ours.random() == plain.random()
