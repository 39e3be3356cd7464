"""The stability guard's rules on a run's scalar series (``foundation.engine.guard`` applies them
while training, ``foundation compare guard`` replays them on logged runs):

* ``Guard``: a value (the model update per unit of the peak learning rate, or a loss) against
  ``factor`` x the median of its last ``window`` healthy readings, one warning per episode;
* ``LossRule``: the training loss jumping (the median of its last 3 steps against its own level);
* ``GivebackRule``: a run that learnt and then lost it, the loss climbing back over tens of steps.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Optional

LOSS_STEPS = 3  # the loss rule judges the median of this many last training losses
# ... and a rise is a jump only once it is also this share of the run's first loss: near a loss of
# zero a relative factor reads noise (12-layer seq2seq at its stable lr, 300 steps: 0.003 -> 0.010
# fired 3.3x in a run that ends at 100 % exact match), while a blow-up rises by more than the first
# loss itself (the divergence onset is twice the first loss)
LOSS_FLOOR = 0.1
GIVEBACK_STEPS = 30  # the giveback rule judges the median of this many last training losses
GIVEBACK_ARMED = 0.25  # ... once the run's best is at least this far (relative) below its first
GIVEBACK_NOISE = 4.0  # ... and by more than this many standard errors of that median


class Guard:
    """Judges each ``update/output`` (per unit of learning rate) against the median of the last
    ``window`` healthy ones; ``check(step, value, lr)`` -> None or the firing's record.

    An episode starts above ``factor`` x that level and ends only once the value is back under
    sqrt(factor) x it (hysteresis): a loss that keeps climbing, dipping under the threshold now and
    then, is one episode and one warning, and what it reads meanwhile never enters the level."""

    def __init__(self, factor: float, window: int, warmup: int, floor: float = 0.0):
        self.factor, self.warmup = factor, warmup
        self.floor = floor  # a rise above the level by no more than this is no jump, whatever its ratio
        self.clear = factor ** 0.5
        self.recent: deque[float] = deque(maxlen=window)
        self.firing = False  # inside an episode: one warning per episode
        self.peak_lr = 0.0

    def check(self, step: int, update: float, lr: float) -> Optional[dict[str, float]]:
        # per unit of the largest lr so far: the current lr while it warms up; after its peak, as
        # the schedule decays, the update shrinks more slowly than the lr (dividing by the
        # current lr made the end of every healthy decaying run look like a jump)
        self.peak_lr = max(self.peak_lr, lr)
        rate = update / self.peak_lr if self.peak_lr > 0 else update
        if len(self.recent) < self.warmup or not self.recent:
            self.recent.append(rate)
            return None
        level = statistics.median(self.recent)
        if rate != rate or (rate > self.factor * level and rate - level > self.floor):  # NaN fires too
            new = not self.firing
            self.firing = True
            return {"step": step, "update": update, "rate": rate, "level": level, "new_episode": new}
        if self.firing and rate > self.clear * level:
            return None  # still inside the episode
        self.firing = False
        self.recent.append(rate)  # only healthy measurements set the level
        return None


class LossRule:
    """The loss rule: the median of the last ``LOSS_STEPS`` training losses (one hard batch is no
    jump, a blow-up is) judged by a ``Guard`` as it is (no lr), a rise counting only once it is also
    ``LOSS_FLOOR`` x the first loss this rule saw. ``check(step, loss)`` -> None or the firing's
    record; the engine keeps one per kind of step, ``foundation compare guard`` replays it on
    logged losses."""

    def __init__(self, factor: float, window: int, warmup: int, first: Optional[float] = None):
        self.guard = Guard(factor, window, warmup)
        self.last: deque[float] = deque(maxlen=LOSS_STEPS)
        self.first: Optional[float] = None
        if first is not None:  # a resumed run's: the floor of its start
            self.start(first)

    @property
    def firing(self) -> bool:
        return self.guard.firing

    def start(self, first: float) -> None:
        self.first, self.guard.floor = first, LOSS_FLOOR * abs(first)

    def check(self, step: int, loss: float) -> Optional[dict[str, float]]:
        if self.first is None and math.isfinite(loss):
            self.start(loss)
        self.last.append(loss)
        return self.guard.check(step, statistics.median(self.last), 0.0)

    def rolled_back(self) -> None:
        """The losses it holds are gone with the steps rolled back; no episode is open."""
        self.guard.firing = False
        self.last.clear()


class GivebackRule:
    """A run that learnt and then lost it: the training loss (the median of the last
    ``GIVEBACK_STEPS`` steps', which no noisy batch moves) has given back more than ``giveback`` of
    the progress it had made, first -> best. Armed only once the run has made real progress (its best
    at most ``1 - GIVEBACK_ARMED`` x its first), so a run that never left its plateau is not judged.

    The update and loss rules miss this failure: on the 12-layer seq2seq ladder with a 100-step
    warm-up, lr 0.03 takes DeepNorm's and Pre-LN's loss from 2.7 to 1.4-1.7 and then, as the lr
    peaks, back to the 2.4 plateau over 40-60 steps, each step within 1.5x of the recent ones.
    Calibrated on logged losses (benchmarks/guard_giveback.py, docs/studies.md): 30 steps and 0.5
    catch 7 of those 8 collapses and fire in none of ~80 healthy runs of the ladders and the tiny
    recipes; 10 or 20 steps, or 0.3-0.4, fire in noisy NLVR2 runs.
    ``check(step, loss)`` -> None or the firing's record (``update``: the smoothed loss, ``level``: its best)."""

    def __init__(self, giveback: float, steps: int = 0):
        self.giveback = giveback
        self.last: deque[float] = deque(maxlen=steps or GIVEBACK_STEPS)
        self.first: Optional[float] = None
        self.best = float("inf")
        self.firing = False

    @property
    def smoothed(self) -> Optional[float]:
        return statistics.median(self.last) if len(self.last) == self.last.maxlen else None

    @property
    def at_best(self) -> bool:
        """The loss is at its best so far, now and not only on average (the 30-step median lags a
        climb by up to 15 steps; the last few losses do not): a state worth rolling back to."""
        s = self.smoothed
        return s is not None and s <= self.best and statistics.median(list(self.last)[-LOSS_STEPS:]) <= self.best

    def check(self, step: int, loss: float) -> Optional[dict[str, float]]:
        self.last.append(loss)
        s = self.smoothed
        if s is None:
            return None
        if self.first is None:
            self.first = self.best = s
            return None
        self.best = min(self.best, s)
        progress = self.first - self.best
        armed = self.best <= (1 - GIVEBACK_ARMED) * self.first
        # and beyond the noise: the best is the lowest of many noisy medians, so a median a few of its
        # standard errors (1.25 x the losses' robust std / sqrt(n)) above it is no change at all
        mad = statistics.median(abs(x - s) for x in self.last)
        noise = GIVEBACK_NOISE * 1.25 * 1.4826 * mad / len(self.last) ** 0.5
        if armed and s > self.best + max(self.giveback * progress, noise):
            new = not self.firing
            self.firing = True
            return {"step": step, "update": s, "rate": (s - self.best) / progress, "level": self.best,
                    "first": self.first, "new_episode": new}
        if self.firing and s > self.best + 0.5 * self.giveback * progress:
            return None  # still inside the episode (hysteresis, as the other rules)
        self.firing = False
        return None

    def rolled_back(self) -> None:
        """Back at (or near) the best state: its losses start a new window; first and best stay."""
        self.firing = False
        self.last.clear()
