"""The run directory: owned by one process at a time, its config checked on resume, its
failures recorded.

Ownership is an exclusive ``fcntl.flock`` on ``<run_dir>/.lock`` taken by rank 0 before
anything in the directory is read or written, held until the run returns. The kernel
releases it when the process dies however it dies (kill -9 included), so a crashed run
never leaves the directory stuck; the holder writes its pid, host and command into the
file so that a refused run can name it.

On resume the config given now is compared with the run's ``config.yaml``: a field that
differs is refused, with the list of differences, unless ``allow_change`` (the
``--allow-change KEY`` flag) names it; an allowed change is used, logged as a
``config_change`` event in metrics.jsonl, and recorded as a comment at the top of
``config.yaml`` (which stays a loadable config). Fields that do not change what is
trained (where the run lives and how it reports: ``FREE``) may differ freely.
"""
from __future__ import annotations

import fcntl
import fnmatch
import json
import os
import shutil
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Sequence

from omegaconf import OmegaConf

from foundation.config import ConfigError, build, to_dict, yaml_text
from foundation.engine import distributed
from foundation.engine.run_state import write_text_atomic
from foundation.engine.distributed import Env
from foundation.engine.failure import RunDirInUse, classify

LOCK_FILE = ".lock"
CONFIG_FILE = "config.yaml"
STATUS_FILE = "status.json"  # the outcome of the last invocation, written when it returns or fails
ERROR_LOG = "error.log"  # the traceback of a failure
HISTORY_PREFIX = "#   step "
# may differ on resume without --allow-change: where the run lives, how it is run and reported
FREE = ("resume", "overwrite", "checkpoint", "allow_change", "run_name", "output_dir", "device", "train.stop_at",
        "train.num_workers", "log.*", "save.every", "save.keep")
_MISSING = "<absent>"


class RunDir:
    """``with RunDir(path, env) as rd:`` owns ``path`` (rank 0 holds the lock) inside.
    ``committed`` becomes true once this invocation has made the directory its own (the
    config written); from then on a failure is recorded there (``record_failure``)."""

    def __init__(self, path: str | Path, env: Env):
        self.path, self.env = Path(path), env
        self.committed = False
        self._fd: int | None = None

    def __enter__(self) -> "RunDir":
        holder = ""
        if self.env.is_main:
            self._fd, holder = lock(self.path)
        if not distributed.broadcast_flag(not holder, self.env):
            raise RunDirInUse(f"{self.path} is in use by another run ({holder or 'see rank 0'}); wait for it to "
                              "end, or give this run another run_name=...")
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def clear(self) -> None:
        """Remove everything in the directory but the lock (overwrite=true)."""
        clear(self.path)

    def record_failure(self, e: BaseException, step: int | None, steps: int) -> None:
        """status.json ("failed", the class, the one line) and the traceback in error.log;
        nothing before the directory is this invocation's own (a refused start changes nothing)."""
        if not (self.env.is_main and self.committed):
            return
        kind, code, message = classify(e)
        try:
            with open(self.path / ERROR_LOG, "a") as f:
                f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} step {step}\n")
                f.write("".join(traceback.format_exception(e)))
            info = {"status": "failed", "failure": kind, "exit_code": code, "step": step, "steps": steps,
                    "message": message, "metrics": {}, "error_log": ERROR_LOG, "time": round(time.time(), 3)}
            write_text_atomic(self.path / STATUS_FILE, json.dumps(info, indent=2) + "\n")
        except OSError:  # the disk is full: the message on the terminal is all there is
            pass


def lock(path: Path, wait: bool = False) -> tuple[int | None, str]:
    """(fd, '') once this process holds ``path``'s lock (closing fd releases it), else (None, who
    holds it); ``wait``: block until the holder ends. The holder's pid, host and command go in the file."""
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except OSError:
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        os.close(fd)
        return None, holder or "a process that has not written its name yet"
    except BaseException:  # Ctrl-C while waiting
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {started}: {' '.join(sys.argv)}\n".encode(), 0)
    return fd, ""


def clear(path: Path) -> None:
    """Remove everything in ``path`` but its lock (whoever clears holds it)."""
    for p in path.iterdir():
        if p.name != LOCK_FILE:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


# --------------------------------------------------------------------------- resume: config


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"optim.lr": 0.001, "tasks.<id>.field": ..., ...}; task lists are keyed by task id."""
    out: dict[str, Any] = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(tree, list) and tree and all(isinstance(t, dict) and "id" in t for t in tree):
        for t in tree:
            out.update(flatten(t, f"{prefix}{t['id']}."))
    else:
        out[prefix[:-1]] = tree
    return out


def _matches(key: str, patterns: Sequence[str]) -> bool:
    return any(key == p or key.startswith(p + ".") or fnmatch.fnmatchcase(key, p) for p in patterns)


def config_changes(old: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """[(key, old value, new value)] of the fields that differ, outside ``FREE``."""
    a, b = flatten(old), flatten(new)
    keys = sorted(set(a) | set(b))
    return [(k, a.get(k, _MISSING), b.get(k, _MISSING)) for k in keys
            if a.get(k, _MISSING) != b.get(k, _MISSING) and not _matches(k, FREE)]


def _show(v: Any) -> str:
    return v if v == _MISSING else json.dumps(v)


def describe_changes(changes: Sequence[tuple[str, Any, Any]]) -> str:
    return ", ".join(f"{k}: {_show(a)} -> {_show(b)}" for k, a, b in changes)


def resume_changes(path: Path, cfg: Any) -> list[tuple[str, Any, Any]]:
    """The changes of ``cfg`` against the run's config.yaml; ConfigError listing those that
    ``cfg.allow_change`` does not name, or naming a key of it that no field matches. Reads only."""
    saved = path / CONFIG_FILE
    old: dict = {}
    if saved.is_file():
        try:
            old = to_dict(build(type(cfg), OmegaConf.load(saved), where=str(saved)))
        except (ConfigError, ValueError) as e:
            raise ConfigError(f"{saved}: the run's config cannot be read to compare it with this one ({e})") from None
    new = to_dict(cfg)
    known = set(flatten(old)) | set(flatten(new))
    unknown = [p for p in cfg.allow_change if not any(_matches(k, [p]) for k in known)]
    if unknown:  # a typo would otherwise be accepted silently, and the change it meant refused
        raise ConfigError(f"--allow-change {unknown[0]}: the config has no such field or section (e.g. optim.lr, "
                          "train.steps, optim)")
    if not old:
        return []  # a run directory from before config.yaml: nothing to compare with
    changes = config_changes(old, new)
    refused = [c for c in changes if not _matches(c[0], cfg.allow_change)]
    if refused:
        flags = " ".join(f"--allow-change {k}" for k, _, _ in refused)
        raise ConfigError(f"resume: {len(refused)} field(s) differ from the run's {saved}: {describe_changes(refused)}; "
                          f"resume with the run's values, or accept the change(s) with {flags}")
    return changes


def write_config(path: Path, cfg: Any, changes: Sequence[tuple[str, Any, Any]] = (), step: int = 0,
                 resumed: bool = False) -> None:
    """config.yaml: the config as YAML, after the history of changes accepted on resume
    (YAML comments, oldest first; the file stays a config that loads)."""
    saved = path / CONFIG_FILE
    history = []
    if resumed and saved.is_file():
        history = [line for line in saved.read_text().splitlines() if line.startswith(HISTORY_PREFIX)]
    history += [f"{HISTORY_PREFIX}{step}: {k}: {_show(a)} -> {_show(b)}" for k, a, b in changes]
    data = to_dict(cfg)
    data["allow_change"] = []  # a permission for one invocation, not part of the run
    header = "# changed on resume (--allow-change), oldest first:\n" + "".join(h + "\n" for h in history) if history else ""
    write_text_atomic(saved, header + yaml_text(data))
