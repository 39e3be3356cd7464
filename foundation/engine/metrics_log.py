"""What a run reports: a progress line per step, and its metrics through a short list of
writers (rank 0): ``metrics.jsonl`` (the record that resume, ``foundation compare`` and
``foundation plot`` read), TensorBoard, CSV, or a writer of your own.

A writer is any class with ``__init__(run_dir, resume_step)``, ``write(step, record)`` and
``close()``; ``record`` is ``{"step", "time", name: value, ...}`` (values are numbers, strings
for non-finite floats, or an event's fields). ``log.writers`` in the config names writers
registered here or ``module:Class`` of your own, e.g. to send metrics to a tracker::

    class Tracker:
        def __init__(self, run_dir, resume_step): self.run = my_tracker.init(dir=run_dir)
        def write(self, step, record): self.run.log(record, step=step)
        def close(self): self.run.finish()

    log: {writers: [jsonl, tensorboard, mypackage.tracking:Tracker]}

On resume from step k every writer drops what it wrote after k (written after the
checkpoint, before the stop), so its output reads as one uninterrupted run.
"""
from __future__ import annotations

import csv
import importlib
import importlib.util
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from tqdm import tqdm

from foundation.checkpoint import CheckpointError
from foundation.config import ConfigError
from foundation.engine.failure import write_failure


class Writer(Protocol):
    def write(self, step: int, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


WRITERS: dict[str, Callable[[Path, Optional[int]], Writer]] = {}


def register_writer(name: str):
    """``@register_writer("name")`` on a writer class makes ``log.writers: [name]`` use it."""
    def deco(cls):
        WRITERS[name] = cls
        return cls
    return deco


def writer_class(spec: str) -> Callable[[Path, Optional[int]], Writer]:
    """A registered writer by name, or ``module:Class``; ConfigError naming the field otherwise."""
    if spec in WRITERS:
        return WRITERS[spec]
    module, _, attr = spec.partition(":")
    if not attr:
        raise ConfigError(f"field 'log.writers': unknown writer {spec!r}; known: {', '.join(WRITERS)} "
                          "or module:Class of your own")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"field 'log.writers': cannot load writer {spec!r}: {e}") from None


def _jsonable(v: Any) -> Any:
    """Floats that are not finite become strings ("nan", "inf"): metrics.jsonl stays strict JSON."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def _guard(path: Path, write):
    """``write()``, a failure named with the file (and a full disk called so)."""
    try:
        return write()
    except OSError as e:
        raise write_failure(path, e) from e


def _scalars(record: dict[str, Any]):
    for k, v in record.items():
        if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool):
            yield k, v


@register_writer("jsonl")
class JsonlWriter:
    """metrics.jsonl: one JSON object per line, ``step`` in each. A torn last line (a process
    killed while writing it) is dropped on resume with a warning; any other unreadable line is
    a ``CheckpointError`` naming the file and line: the run's record is damaged."""

    def __init__(self, run_dir: Path, resume_step: Optional[int] = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        if resume_step is not None and self.path.is_file():
            kept = [line for line, record in self._read() if record.get("step", 0) <= resume_step]
            _guard(self.path, lambda: self.path.write_text("".join(line + "\n" for line in kept)))
        self.file = _guard(self.path, lambda: open(self.path, "a"))

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

    def write(self, step: int, record: dict[str, Any]) -> None:
        _guard(self.path, lambda: (self.file.write(json.dumps(record) + "\n"), self.file.flush()))

    def close(self) -> None:
        self.file.close()


@register_writer("csv")
class CsvWriter:
    """metrics.csv in long form (step, time, name, value): one row per scalar, so train,
    eval and event records of different keys share one header that spreadsheets and pandas read."""

    HEADER = ["step", "time", "name", "value"]

    def __init__(self, run_dir: Path, resume_step: Optional[int] = None):
        self.path = Path(run_dir) / "metrics.csv"
        kept = []
        if resume_step is not None and self.path.is_file():
            with open(self.path, newline="") as f:
                kept = [r for r in csv.reader(f) if r and r[0].isdigit() and int(r[0]) <= resume_step]

        def start():
            with open(self.path, "w", newline="") as f:
                csv.writer(f).writerows([self.HEADER, *kept])

        _guard(self.path, start)
        self.file = _guard(self.path, lambda: open(self.path, "a", newline=""))
        self.csv = csv.writer(self.file)

    def write(self, step: int, record: dict[str, Any]) -> None:
        rows = [[step, record.get("time"), k, v] for k, v in _scalars(record)]
        _guard(self.path, lambda: (self.csv.writerows(rows), self.file.flush()))

    def close(self) -> None:
        self.file.close()


@register_writer("tensorboard")
class TensorBoardWriter:
    """Scalars under run_dir/tb (``tensorboard --logdir RUN_DIR/tb``)."""

    def __init__(self, run_dir: Path, resume_step: Optional[int] = None):
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(str(Path(run_dir) / "tb"), purge_step=resume_step + 1 if resume_step else None)

    def write(self, step: int, record: dict[str, Any]) -> None:
        for k, v in _scalars(record):
            self.tb.add_scalar(k, v, step)

    def close(self) -> None:
        self.tb.close()


class MetricsLog:
    """The run's metrics, every record to each writer of ``log.writers`` (rank 0 only)."""

    def __init__(self, run_dir: Path, *, enabled: bool, writers: list[str], resume_step: int | None = None):
        self.writers: list[Writer] = []
        if not enabled:
            return
        for spec in writers:
            if spec == "tensorboard" and importlib.util.find_spec("tensorboard") is None:
                print("warning: log.writers: tensorboard is not installed, so this run writes no TensorBoard logs "
                      "(pip install tensorboard, or set log.writers=[jsonl])", file=sys.stderr, flush=True)
                continue
            self.writers.append(writer_class(spec)(Path(run_dir), resume_step))

    def log(self, step: int, values: dict[str, Any]) -> None:
        record = {"step": step, "time": round(time.time(), 3), **{k: _jsonable(v) for k, v in values.items()}}
        for w in self.writers:
            w.write(step, record)

    def event(self, step: int, event: str, **info: Any) -> None:
        self.log(step, {"event": event, **info})

    def close(self) -> None:
        for w in self.writers:
            w.close()


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
