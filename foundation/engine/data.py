"""Data order as a function of (seed, epoch): resumable, sharded streams of micro-batches.

Global micro-batch g of an epoch is ``perm[g*B*W : (g+1)*B*W]`` of the epoch's
permutation (B = per-process batch, W = processes) and rank r takes its r-th slice of B.
So one process with batch 8 sees, per step, exactly the samples two processes with
batch 4 see together, and a stream resumes at (epoch, micro-batch) without replaying.

Per-item randomness (augmentation, masks) is a function of (a base seed, the item index):
``item_seed`` gives the seed, ``seeded`` runs code written for the global RNGs under it.
In training the base comes from the DataLoader worker's seed, or, without workers, from one
draw of torch's RNG, which the engine saves and restores on resume; at evaluation it is
fixed, so every evaluation sees the same items.
"""
from __future__ import annotations

import contextlib
import random
import threading
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from foundation.config import ConfigError


EVAL_SEED_BASE = 12345  # the base of evaluation items' seeds


_HELD = threading.local()  # inside items_fetched(): NumPy's and Python's global states are saved already


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Python's, NumPy's and torch's (CPU) RNGs seeded with ``seed`` inside, restored after:
    transforms written for the global RNGs (timm's, torchvision's) become per-item."""
    held = getattr(_HELD, "on", False)
    py = None if held else random.getstate()
    npy = None if held else np.random.get_state()
    # the CPU generator only, as torch.random.fork_rng(devices=[]) saves it (at a fifth of the
    # cost): torch.manual_seed would also seed every CUDA device's generator and, before CUDA
    # is initialised, queue that call with a formatted stack trace - per item
    cpu = torch.default_generator
    cpu_state = cpu.get_state()
    random.seed(seed)
    np.random.seed(seed % 2**32)
    cpu.manual_seed(seed)
    try:
        yield
    finally:
        cpu.set_state(cpu_state)
        if not held:
            random.setstate(py)
            np.random.set_state(npy)


@contextlib.contextmanager
def items_fetched() -> Iterator[None]:
    """Around the items of one batch: NumPy's and Python's global RNGs saved once and restored
    at the end, so that each item's ``seeded`` block only seeds them. Saving and restoring
    their Mersenne Twisters costs ~95 us, most of a small image's transform; torch's generator
    is still restored after every item, so the draws between items (the items' seeds) come
    from its global stream exactly as without it, and no code between the items of a batch
    draws from NumPy's or Python's global RNG."""
    if getattr(_HELD, "on", False):
        yield
        return
    py, npy = random.getstate(), np.random.get_state()
    _HELD.on = True
    try:
        yield
    finally:
        _HELD.on = False
        random.setstate(py)
        np.random.set_state(npy)


class BatchFetch(Dataset):
    """``dataset`` as the DataLoader sees it: a batch's items fetched inside ``items_fetched``."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        return self.dataset[i]

    def __getitems__(self, indices: Sequence[int]) -> list:
        with items_fetched():
            many = getattr(self.dataset, "__getitems__", None)
            return list(many(indices)) if many is not None else [self.dataset[i] for i in indices]


def item_seed(index: int, train: bool = True) -> int:
    """The seed of one item's randomness: (base, index) hashed. Training: base = the
    DataLoader worker's base seed (the same for every worker of one loader, so it does not
    depend on which worker takes the item), or without workers a draw of torch's global RNG.
    Evaluation: a fixed base."""
    if train:
        info = torch.utils.data.get_worker_info()
        base = info.seed - info.id if info is not None else int(torch.randint(0, 2**62, ()).item())
        base %= 2**63
    else:
        base = EVAL_SEED_BASE
    return int(np.random.SeedSequence([base, index]).generate_state(1, np.uint64)[0] >> 1)


def labelled_fraction(n: int, fraction: Optional[float], seed: int, what: str = "items") -> list[int]:
    """The indices of a label budget: ``fraction`` of ``n`` training items (at least one), drawn by
    a permutation seeded by ``seed`` alone, so the same seed picks the same items on any machine
    and budgets nest (a seed's 10 % are among its 50 %). ``None`` keeps every item. Sorted, so
    the data order stays a function of the training seed only."""
    if fraction is None:
        return list(range(n))
    if not 0.0 < fraction <= 1.0:
        raise ConfigError(f"field 'train_fraction': must be in (0, 1] or null (got {fraction!r})")
    if n == 0:
        raise ConfigError(f"field 'train_fraction': no training {what} to draw a fraction from")
    keep = max(1, round(fraction * n))
    return sorted(np.random.default_rng([seed, 0x1ABE1]).permutation(n)[:keep].tolist())


def epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))


class ShardBatchSampler:
    """This rank's index lists for one epoch, from micro-batch ``start`` on (drop last)."""

    def __init__(self, n: int, batch_size: int, rank: int, world: int, seed: int, epoch: int, start: int = 0):
        self.n, self.batch_size, self.rank, self.world = n, batch_size, rank, world
        self.seed, self.epoch, self.start = seed, epoch, start

    def __len__(self) -> int:
        return max(0, self.n // (self.batch_size * self.world) - self.start)

    def __iter__(self) -> Iterator[list[int]]:
        perm = epoch_permutation(self.n, self.seed, self.epoch).tolist()
        global_batch = self.batch_size * self.world
        for g in range(self.start, self.n // global_batch):
            lo = g * global_batch + self.rank * self.batch_size
            yield perm[lo: lo + self.batch_size]


class TaskStream:
    """Endless micro-batches of one task for this rank; ``state_dict`` is its position."""

    def __init__(self, dataset: Dataset, collate: Callable, *, batch_size: int, rank: int, world: int,
                 seed: int, num_workers: int = 0, name: str = "task", pin_memory: bool = False):
        self.dataset, self.collate = dataset, collate
        self.batch_size, self.rank, self.world, self.seed = batch_size, rank, world, seed
        self.num_workers, self.pin_memory = num_workers, pin_memory
        if len(dataset) < batch_size * world:
            raise ConfigError(
                f"task {name!r}: the training set has {len(dataset)} samples, fewer than one global "
                f"micro-batch ({batch_size} x {world} processes)"
            )
        self.epoch, self.batch = 0, 0  # position of the next micro-batch
        self._it: Iterator | None = None

    def _loader(self) -> Iterator:
        sampler = ShardBatchSampler(len(self.dataset), self.batch_size, self.rank, self.world,
                                    self.seed, self.epoch, self.batch)
        # a generator of its own: creating the iterator then draws nothing from the global
        # RNG (which would shift dropout after a resume) and seeds workers from (seed, epoch)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch + 1)
        # pinned batches: ``to_device(non_blocking=True)`` then overlaps the copy with compute
        return iter(DataLoader(BatchFetch(self.dataset), batch_sampler=sampler, collate_fn=self.collate,
                               num_workers=self.num_workers, generator=generator, pin_memory=self.pin_memory))

    def __iter__(self) -> "TaskStream":
        return self

    def __next__(self) -> Any:
        if self._it is None:
            self._it = self._loader()
        try:
            batch = next(self._it)
        except StopIteration:
            self.epoch, self.batch = self.epoch + 1, 0
            self._it = self._loader()
            batch = next(self._it)
        self.batch += 1
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch": self.batch, "world": self.world, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])
        if (state.get("world"), state.get("batch_size")) != (self.world, self.batch_size):
            # the permutation is the same, but the cut into micro-batches is not
            self.batch = (self.batch * state["batch_size"] * state["world"]) // (self.batch_size * self.world)
        self._it = None


def eval_batches(dataset: Dataset, collate: Callable, batch_size: int, rank: int, world: int,
                 max_batches: int | None = None) -> Iterator[Any]:
    """Every ``world``-th sample from ``rank`` on, in order: each sample on exactly one rank."""
    shard = Subset(dataset, range(rank, len(dataset), world))
    loader = DataLoader(shard, batch_size=batch_size, collate_fn=collate, generator=torch.Generator().manual_seed(0))
    for i, batch in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            break
        yield batch


def step_plan(mix: str, ids: Sequence[str], weights: Sequence[float], step: int, seed: int) -> list[tuple[str, float]]:
    """[(task id, loss weight)] for one optimizer step; the same on every rank.

    sum: every task, loss weighted; round_robin: task ``step mod n``, loss weighted;
    sample: one task drawn with probability proportional to its weight, loss unweighted."""
    if mix == "sum":
        return list(zip(ids, weights))
    if mix == "round_robin":
        i = step % len(ids)
        return [(ids[i], weights[i])]
    (chosen,) = random.Random(seed * 1_000_003 + step).choices(list(ids), weights=list(weights))
    return [(chosen, 1.0)]


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch
