"""What a run reports: a progress line per step, metrics.jsonl and TensorBoard (rank 0)."""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from foundation.checkpoint import CheckpointError
from foundation.engine.failure import write_failure


def _jsonable(v: Any) -> Any:
    """Floats that are not finite become strings ("nan", "inf"): metrics.jsonl stays strict JSON."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


class MetricsLog:
    """metrics.jsonl (one JSON object per line, ``step`` in each) plus TensorBoard scalars.

    On resume from step k the records after k (written after the checkpoint, before the
    stop) are dropped, so the file reads as one uninterrupted run; so is a torn last line
    (a process killed while writing it), with a warning. Any other unreadable line is a
    ``CheckpointError`` naming the file and line: the run's record is damaged."""

    def __init__(self, run_dir: Path, *, enabled: bool, tensorboard: bool, resume_step: int | None = None):
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self.file = self.tb = None
        if not enabled:
            return
        if resume_step is not None and self.path.is_file():
            kept = [line for line, record in self._read() if record.get("step", 0) <= resume_step]
            self._guard(lambda: self.path.write_text("".join(line + "\n" for line in kept)))
        self.file = self._guard(lambda: open(self.path, "a"))
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(Path(run_dir) / "tb"), purge_step=resume_step + 1 if resume_step else None)

    def _read(self) -> list[tuple[str, dict]]:
        lines = [line for line in self.path.read_text(errors="replace").splitlines() if line.strip()]
        out = []
        for n, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise ValueError("not a JSON object")
            except ValueError as e:
                if n == len(lines):
                    print(f"warning: {self.path}: dropped its last line, torn by an interrupted write "
                          f"({len(line)} characters: {line[:40]!r}...)", file=sys.stderr, flush=True)
                    break
                raise CheckpointError(f"{self.path}, line {n}: not a JSON record ({e}); the run's log is damaged "
                                      "(remove the line to resume)") from None
            out.append((line, record))
        return out

    def _guard(self, write):
        """``write()``, a failure named with the file (and a full disk called so)."""
        try:
            return write()
        except OSError as e:
            raise write_failure(self.path, e) from e

    def log(self, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"step": step, "time": round(time.time(), 3), **{k: _jsonable(v) for k, v in values.items()}}
        self._guard(lambda: (self.file.write(json.dumps(record) + "\n"), self.file.flush()))
        if self.tb is not None:
            for k, v in record.items():
                if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self.tb.add_scalar(k, v, step)

    def event(self, step: int, event: str, **info: Any) -> None:
        self.log(step, {"event": event, **info})

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.tb is not None:
            self.tb.close()


class Progress:
    """tqdm bar with loss, lr and throughput on rank 0; plain lines when disabled."""

    def __init__(self, *, enabled: bool, total: int, initial: int, desc: str, every: int, main: bool):
        self.main, self.every = main, every
        self.bar = tqdm(total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True,
                        file=sys.stderr) if enabled and main else None

    def update(self, step: int, loss: float, lr: float, samples_per_s: float, extra: str = "") -> None:
        text = f"loss {loss:.4f} lr {lr:.2e} {samples_per_s:,.0f} samples/s{extra}"
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.update(1)
        elif self.main and step % self.every == 0:
            print(f"step {step} {text}", flush=True)

    def write(self, message: str) -> None:
        if not self.main:
            return
        if self.bar is not None:
            self.bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
