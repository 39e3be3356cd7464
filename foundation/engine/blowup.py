"""The run's divergence rule, whatever the guard's setting: a training loss that blew up and did
not come back ends the run "diverged", and while it is blown up mid-run the model is neither
checkpointed nor kept as best (foundation/engine/loop.py). The same rule as the studies'
(``studies.verdict``), so an engine run and a study agree on what diverged."""
from __future__ import annotations

from collections import deque
from typing import Optional


class LossWatch:
    """The run's first training loss and its recent ones: ``blown_up()`` says whether the loss,
    averaged over the last ``window`` steps, ends above ``factor`` x the first (the studies'
    divergence rule, studies/verdict.py), each task phase against its own first loss. Its state
    travels in the checkpoints."""

    def __init__(self, factor: float, steps: int):
        self.factor = factor
        self.first: Optional[float] = None
        self.recent: deque[float] = deque(maxlen=max(5, steps // 20))
        self.phases: dict[str, float] = {}  # each task's last logged phase

    def add(self, loss: float, phase: tuple = ()) -> None:
        """``phase``: the step's ``(<task>/phase, value)`` pairs. A task's new phase is a new objective
        (the ASR head adds its transducer loss to CTC), judged against its own first loss as the
        studies judge it (``studies.verdict.phase_starts``)."""
        if any(self.phases.get(k, v) != v for k, v in phase):
            self.first = None
            self.recent.clear()
        self.phases.update(phase)
        if self.first is None and loss == loss:
            self.first = loss
        self.recent.append(loss)

    def rolled_back(self) -> None:
        """The recent losses are of weights the guard's ``recover`` just discarded: forget them (one
        spike of 1e4 would otherwise hold a 70-step window above the limit after a good rollback)."""
        self.recent.clear()

    def above(self) -> Optional[str]:
        """What the recent loss is when it is above the limit now (None while it is not). Mid-run
        the model is then no "last good" one: the loop neither checkpoints it nor keeps it as best."""
        if not self.factor or self.first is None or not self.recent:
            return None
        mean = sum(self.recent) / len(self.recent)
        if mean == mean and mean <= self.factor * self.first:
            return None
        return (f"{mean:.4g} over the last {len(self.recent)} steps against {self.first:.4g} at the first "
                f"(train.explode_factor={self.factor:g})")

    def blown_up(self) -> Optional[str]:
        """Said at the end of a run: the loss is above the limit and did not come back."""
        above = self.above()
        return None if above is None else f"the training loss blew up and did not come back: {above}"

    def state_dict(self) -> dict:
        return {"first": self.first, "recent": list(self.recent), "phases": dict(self.phases)}

    def load_state_dict(self, state: dict) -> None:
        self.first = state["first"]
        self.recent.extend(state["recent"])
        self.phases = dict(state.get("phases", {}))
