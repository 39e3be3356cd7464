"""One `foundation train` run as the studies see it: launch it, resume it, read what it left.

Every study starts its runs through ``launch`` / ``ensure`` and reads a run directory only
through the readers here:

    status.json     ``read_status`` / ``status``: how the engine's last invocation ended
    metrics.jsonl   ``read_records``; ``train_losses``, ``eval_series`` (curves) and
                    ``last_eval`` (the last evaluation) on its records
    config.yaml     ``config_mismatch``: does the run directory hold this configuration?
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from foundation.engine.failure import RunDirInUse
from foundation.engine.rundir import STATUS_FILE, clear, lock

METRICS_FILE = "metrics.jsonl"
DONE = ("finished", "diverged")  # engine statuses that need no further training


# ---------------------------------------------------------------------------- reading


def number(v: Any) -> Optional[float]:
    """metrics.jsonl numbers; the engine writes non-finite floats as strings ("nan", "inf")."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def read_records(run_dir: str | Path, *, required: bool = False) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl``, in file order; a line that does not parse (cut
    by a kill) is skipped. No file: [] (``required``: FileNotFoundError)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        if required:
            raise FileNotFoundError(f"{path} not found: is {run_dir} a run directory?")
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill: the rest is still good
                continue
            if isinstance(record, dict):
                out.append(record)
    return out


def train_losses(records: list[dict]) -> tuple[list[int], list[float]]:
    """(steps, losses) of the logged training steps that were taken (not skipped), finite."""
    steps, losses = [], []
    for r in records:
        if "event" in r or r.get("skipped") or "loss" not in r:
            continue
        v = number(r["loss"])
        if v is not None and math.isfinite(v):
            steps.append(int(r["step"]))
            losses.append(v)
    return steps, losses


def eval_series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of ``eval/<key>``; a later record for a step wins."""
    by_step: dict[int, float] = {}
    for r in records:
        v = number(r.get(f"eval/{key}"))
        if v is not None:
            by_step[int(r["step"])] = v
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def last_eval(records: list[dict]) -> tuple[Optional[int], dict[str, float]]:
    """(step, {task_id/metric: value}) of the last evaluation record; (None, {}) if none."""
    for r in reversed(records):
        values = {k[len("eval/"):]: number(v) for k, v in r.items() if k.startswith("eval/")}
        if values:
            return int(r["step"]), {k: v for k, v in values.items() if v is not None}
    return None, {}


def read_status(run_dir: str | Path) -> Optional[dict]:
    """status.json (written by the engine when an invocation returns or fails), or None."""
    try:
        info = json.loads((Path(run_dir) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and "status" in info else None


def status(run_dir: str | Path) -> Optional[str]:
    info = read_status(run_dir)
    return info["status"] if info else None


def config_mismatch(run_dir: Path, wanted: dict,
                    same: Optional[Callable[[str, Any, Any], bool]] = None) -> list[str]:
    """Keys whose value in ``run_dir/config.yaml`` differs from ``wanted`` (a resolved config
    as a dict); settings that do not change the result (logging, resume) are ignored, and so is
    a difference ``same(key, saved, wanted)`` accepts."""
    from omegaconf import OmegaConf

    path = run_dir / "config.yaml"
    if not path.is_file():
        return []
    from foundation.engine.rundir import config_changes

    # the engine's own rule for what a run's result depends on (rundir.FREE may differ)
    return [k for k, was, now in config_changes(OmegaConf.to_container(OmegaConf.load(path), resolve=True), wanted)
            if same is None or not same(k, was, now)]


# ---------------------------------------------------------------------------- launching


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent(parent: int) -> Callable[[], None]:
    """A child's preexec_fn: the kernel ends it when the study that started it dies, however it
    dies (kill -9 included), so no run trains on alone (Linux; elsewhere a re-run waits for it)."""
    libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None  # loaded before the fork

    def preexec() -> None:
        if libc is not None:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:  # the parent died before prctl
                os.kill(os.getpid(), signal.SIGTERM)
    return preexec


def launch(config: str | Path, overrides: Sequence[str], log: Path, env: Optional[dict] = None) -> int:
    """``foundation train CONFIG overrides`` in its own process, its output appended to ``log``
    (after the command line); the exit code. The process ends with the caller's."""
    # -P: the working directory is not put first on sys.path, so a file of the user's there
    # (a tasks.py, a studies/ folder) is never imported in place of this project's modules
    cmd = [sys.executable, "-P", "-m", "foundation.cli", "train", str(config), *overrides]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent(os.getpid()),
                              env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    return proc.returncode


@contextlib.contextmanager
def owned(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s lock (a study's output folder) inside; RunDirInUse naming the holder when
    another process holds it, so that two studies never run and report into one folder."""
    fd, holder = lock(folder)
    if fd is None:
        raise RunDirInUse(f"{folder} is in use by another study ({holder}); wait for it to end, or choose "
                          "another --out")
    try:
        yield
    finally:
        os.close(fd)


def train(config: Path, overrides: Sequence[str], run_dir: Path, in_process: bool = False) -> str:
    """Train one run (its overrides name ``run_dir``); '' when the engine returned (any status),
    else what went wrong. Ctrl-C ends the caller too (KeyboardInterrupt)."""
    if in_process:
        from foundation.engine.config import load_config
        from foundation.engine.loop import train as engine_train

        try:
            result = engine_train(*load_config(config, list(overrides)))
        except KeyboardInterrupt:
            raise
        except Exception as e:  # a crash ends this run, not the study
            return f"{type(e).__name__}: {e}"
        if result.status == "interrupted":  # the engine caught Ctrl-C: end the study too
            raise KeyboardInterrupt
        return ""
    code = launch(config, overrides, run_dir / "train.log")
    if code == 130:
        raise KeyboardInterrupt
    if code in (0, 1) and status(run_dir) is not None:  # 1: diverged
        return ""
    tail = (run_dir / "train.log").read_text().strip().splitlines()[-3:]
    return f"exit code {code}: " + " | ".join(tail)


def ensure(config: Path, overrides: Sequence[str], run_dir: Path, *, in_process: bool = False,
           overwrite: bool = False, say: Callable[[str], None] = print, head: str = "") -> Optional[str]:
    """Bring one run to its end once: skipped when status.json says it finished or diverged
    (unless ``overwrite``: then its directory is emptied), resumed from its last checkpoint
    when it has begun, else trained. None when skipped, else as ``train``. A run directory
    another process holds (a run left by a killed study, a `foundation train` of the user's) is
    waited for and then judged by its own status.json; ``overwrite`` of it is refused
    (RunDirInUse), nothing deleted."""
    if run_dir.is_dir():
        fd, holder = lock(run_dir)
        if fd is None:
            if overwrite:
                raise RunDirInUse(f"{run_dir} is in use by another process ({holder}); not replaced: wait for it "
                                  "to end")
            say(f"{head}: in use by another process ({holder}); waiting for it to end")
            fd, _ = lock(run_dir, wait=True)
        try:
            if overwrite:
                clear(run_dir)  # under the run's lock: never a directory that another process is training
        finally:
            os.close(fd)
    done = status(run_dir)
    if done in DONE and not overwrite:
        say(f"{head}: {done} earlier, skipped")
        return None
    resume = run_dir.is_dir() and ((run_dir / "ckpt").is_dir() or (run_dir / METRICS_FILE).is_file())
    start = time.perf_counter()
    say(f"{head}: {'resuming' if resume else 'training'} ...")
    failure = train(config, [*overrides, *(["resume=true"] if resume else [])], run_dir, in_process)
    say(f"{head}: {'failed' if failure else 'done'} in {time.perf_counter() - start:.1f} s")
    return failure
