"""Run state for exact resume: a run directory's training checkpoints (the model file, written
by ``foundation.checkpoint``, plus optimizer / RNG / data-position state), written so that a
crash never costs the last one.

Layout of a run directory::

    .lock                          held by the process that owns the run (rundir.py)
    config.yaml                    the resolved config (+ the changes accepted on resume)
    metrics.jsonl, tb/             logs
    status.json, error.log         how the last invocation ended (and its traceback if it failed)
    ckpt/step_000100/
        model.safetensors          weights + model config (foundation.checkpoint.save)
        state.pt                   optimizer, scheduler, scaler, EMA, data position, RNG,
                                   counters: tensors and plain containers only, read with
                                   torch.load(weights_only=True)
        rng_rank1.pt ...           the other processes' RNG states
    last                           pointer file: "ckpt/step_000100"
    best/model.safetensors, best/metrics.json

A checkpoint is written into ``ckpt/.tmp-step_000100``, synced, then renamed: a step
directory either exists whole or not at all. ``last`` is replaced atomically after the
rename, and only then are checkpoints beyond the newest ``keep`` removed.
"""
from __future__ import annotations

import contextlib
import json
import os
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from safetensors import SafetensorError

from foundation.checkpoint import CheckpointError, atomic_write, fsync_path
from foundation.engine import distributed
from foundation.engine.distributed import Env
from foundation.engine.failure import one_line, write_failure

STEP_DIR = re.compile(r"^step_(\d+)$")
MODEL_FILE, STATE_FILE = "model.safetensors", "state.pt"


def write_text_atomic(path: Path, text: str) -> None:
    with _writing(path):
        atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def rng_state() -> dict[str, Any]:
    """This process's random states, as tensors and plain values."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def _writing(path: Path, partial: Path | None = None) -> Iterator[None]:
    """A failed write raised as ``DiskFull`` / ``WriteFailed`` naming ``path``; the partial
    checkpoint ``partial`` is removed, giving its space back."""
    try:
        yield
    except (OSError, RuntimeError, SafetensorError) as e:
        failure = write_failure(path, e)  # before the partial files go: it looks at the free space
        if partial is not None:
            shutil.rmtree(partial, ignore_errors=True)
        raise failure from e


def load_trusted_state(path: Path) -> dict[str, Any]:
    """A training state written by the engine (``torch.load`` with ``weights_only=True``:
    tensors and plain values only, never code). ``CheckpointError`` naming the file when
    it is unreadable (truncated) or holds anything else, such as pickled objects."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's own text advises weights_only=False, i.e. running the file's code: not repeated
        found = re.search(r"unsupported (?:global: )?GLOBAL [\w.]+|unsupported operand \d+", str(e), re.IGNORECASE)
        raise CheckpointError(
            f"{path}: refused: the file holds Python objects that are not tensors or plain values "
            f"({found.group(0) if found else 'an object torch refuses to load safely'}); foundation never writes "
            "such a file (it was altered, or comes from elsewhere) and loading it could run code. Resume from an "
            "earlier checkpoint (remove this step's folder) or start the run again") from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: unreadable training state, truncated or not written by foundation train "
                              f"({one_line(e)}); resume from an earlier checkpoint (remove this step's folder)") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: not a training state (a {type(state).__name__}, expected a dict)")
    return state


def step_of(path: Path) -> int:
    m = STEP_DIR.match(path.name)
    return int(m.group(1)) if m else -1


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """A run's finished checkpoints (``ckpt/step_*`` with weights and state), oldest first."""
    ckpt_dir = Path(run_dir) / "ckpt"
    if not ckpt_dir.is_dir():
        return []
    found = [p for p in ckpt_dir.iterdir() if STEP_DIR.match(p.name) and (p / MODEL_FILE).is_file()
             and (p / STATE_FILE).is_file()]
    return sorted(found, key=step_of)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint ``last`` names; the newest complete one if the pointer is stale."""
    pointer = Path(run_dir) / "last"
    if pointer.is_file():
        target = Path(run_dir) / pointer.read_text().strip()
        if (target / MODEL_FILE).is_file() and (target / STATE_FILE).is_file():
            return target
    done = complete_checkpoints(run_dir)
    return done[-1] if done else None


def model_file(path: str | Path) -> Path:
    """The weights a user means by ``path``: a .safetensors file, a checkpoint directory, or a
    run directory (its best/, else its latest checkpoint)."""
    path = Path(path)
    if path.is_file():
        return path
    for candidate in (path / MODEL_FILE, path / "best" / MODEL_FILE):
        if candidate.is_file():
            return candidate
    latest = latest_checkpoint(path)
    if latest is None:
        raise FileNotFoundError(f"no model.safetensors in {path} (nor best/ or a checkpoint under ckpt/)")
    return latest / MODEL_FILE


class Checkpointer:
    def __init__(self, run_dir: Path, keep: int, env: Env):
        self.run_dir, self.keep, self.env = Path(run_dir), keep, env
        self.ckpt_dir = self.run_dir / "ckpt"

    def complete(self) -> list[Path]:
        return complete_checkpoints(self.run_dir)

    def latest(self) -> Path | None:
        return latest_checkpoint(self.run_dir)

    def clean(self) -> None:
        """Remove what an interrupted write or prune left behind (rank 0, at start)."""
        if self.env.is_main and self.ckpt_dir.is_dir():
            for p in self.ckpt_dir.iterdir():
                if p.name.startswith((".tmp-", ".trash-")):
                    shutil.rmtree(p, ignore_errors=True)

    def save(self, step: int, write_model: Callable[[Path], None], state: dict[str, Any]) -> Path:
        """Collective: every rank calls it. Rank 0 writes the weights (``write_model``) and
        ``state``; the other ranks add their RNG state."""
        name = f"step_{step:06d}"
        final, tmp = self.ckpt_dir / name, self.ckpt_dir / f".tmp-{name}"
        if self.env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            with _writing(tmp):
                tmp.mkdir(parents=True)
        distributed.barrier()
        if self.env.is_main:
            with _writing(tmp / MODEL_FILE, tmp):
                write_model(tmp / MODEL_FILE)
            with _writing(tmp / STATE_FILE, tmp):
                torch.save(state, tmp / STATE_FILE)
                fsync_path(tmp / STATE_FILE)
        else:
            path = tmp / f"rng_rank{self.env.rank}.pt"
            with _writing(path):
                torch.save(rng_state(), path)
                fsync_path(path)
        distributed.barrier()
        if self.env.is_main:
            fsync_path(tmp)
            if final.exists():  # the same step saved again (e.g. stop_at then resume): replace it
                trash = self.ckpt_dir / f".trash-{name}"
                os.rename(final, trash)
                shutil.rmtree(trash, ignore_errors=True)
            os.rename(tmp, final)
            fsync_path(self.ckpt_dir)
            write_text_atomic(self.run_dir / "last", f"ckpt/{name}\n")
            self._prune(keep=final)
        distributed.barrier()
        return final

    def _prune(self, keep: Path) -> None:
        for old in self.complete()[:-self.keep]:
            if old != keep:
                trash = self.ckpt_dir / f".trash-{old.name}"
                os.rename(old, trash)  # atomic: a half-deleted checkpoint is never "complete"
                shutil.rmtree(trash, ignore_errors=True)

    def load_state(self, path: Path) -> dict[str, Any]:
        state = load_trusted_state(path / STATE_FILE)
        if self.env.rank > 0:
            own = path / f"rng_rank{self.env.rank}.pt"
            state["rng"] = load_trusted_state(own) if own.is_file() else None
        return state

    def save_best(self, write_model: Callable[[Path], None], info: dict[str, Any]) -> None:
        """Rank 0: best/model.safetensors, then best/metrics.json naming its step."""
        best = self.run_dir / "best"
        with _writing(best / MODEL_FILE):
            best.mkdir(parents=True, exist_ok=True)
            write_model(best / MODEL_FILE)
        write_text_atomic(best / "metrics.json", json.dumps(info, indent=2) + "\n")
