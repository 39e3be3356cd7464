"""How a run fails: the failure classes, their exit codes, and the one line that says why.

Every failure of ``foundation train`` - at start or mid-run - is reported as one line
naming the file or field and what was expected, with an exit code per class (below).
When the run directory was already the run's own (locked, config written), the failure
is also recorded there: ``status.json`` with ``"status": "failed"``, the class and the
line, and the full traceback in ``error.log`` (``--debug`` prints it too).

    exit  class        raised for
    1     diverged     (not a failure: a result; see loop.py)
    2     config       ConfigError: a config field, a missing path, a refused resume
    3     data         DataError: a bad input file met while loading batches
    4     checkpoint   CheckpointError: an unreadable or unsafe checkpoint, a corrupt run file
    5     locked       RunDirInUse: another process owns the run directory
    6     disk_full    DiskFull: no space left while writing
    7     io           WriteFailed: another error while writing the run's files
    70    internal     anything else: a bug (the traceback is in error.log)
    130   interrupted  Ctrl-C
"""
from __future__ import annotations

import errno
import re
import resource
import shutil
from pathlib import Path

from foundation.checkpoint import CheckpointError
from foundation.config import ConfigError

EXIT_CODES = {"diverged": 1, "config": 2, "data": 3, "checkpoint": 4, "locked": 5, "disk_full": 6, "io": 7,
              "internal": 70, "interrupted": 130}
# torch's zip writer and safetensors report a short write (ENOSPC underneath) in these words
_SHORT_WRITE = re.compile(r"unexpected pos \d+ vs \d+|file write failed|No space left on device|StorageFull")
_LOW_SPACE = 64 * 2**20  # bytes: below this a short write is taken for a full disk


class DataError(ValueError):
    """A batch could not be loaded: a bad input file, met during training or evaluation."""


class RunDirInUse(RuntimeError):
    """Another process holds the run directory's lock; the message names it."""


class DiskFull(OSError):
    """No space left on the device while writing a run's file; the message names the file."""


class WriteFailed(OSError):
    """Writing a run's file failed for another reason than a full disk."""


def one_line(e: BaseException) -> str:
    """The message of ``e`` on one line. An exception re-raised by a DataLoader worker
    carries the worker's traceback; its last line is the original message."""
    text = str(e).strip()
    if "Original Traceback" in text:
        last = text.splitlines()[-1].strip()
        text = last.split(": ", 1)[1] if re.match(r"^[\w.]+: ", last) else last
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    text = "; ".join(lines) or type(e).__name__
    if not isinstance(e, (ValueError, OSError)):  # ours are ValueErrors whose message says it all
        text = f"{type(e).__name__}: {text}"
    return text


def _chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _free_bytes(path: Path) -> int | None:
    for p in (path, *path.parents):
        if p.exists():
            try:
                return shutil.disk_usage(p).free
            except OSError:
                return None
    return None


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def write_failure(path: str | Path, e: BaseException, free: int | None = None) -> OSError:
    """What to raise when writing ``path`` failed with ``e``: ``DiskFull`` when the device
    is full (ENOSPC, or a short write with little space left), else ``WriteFailed``."""
    path = Path(path)
    free = _free_bytes(path) if free is None else free
    codes = {getattr(x, "errno", None) for x in _chain(e)}
    short = any(_SHORT_WRITE.search(str(x)) for x in _chain(e))
    where = f" ({_size(free)} free there)" if free is not None else ""
    if codes & {errno.ENOSPC, errno.EDQUOT} or (short and free is not None and free < _LOW_SPACE):
        return DiskFull(f"disk full: could not write {path}{where}; free some space (or choose "
                                      "another output_dir) and continue with --resume")
    if short:
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        why = (f"a file size limit (ulimit -f) of {_size(limit)} is set" if limit != resource.RLIM_INFINITY
               else "is the disk full?")
        return WriteFailed(f"could not write {path}: a short write ({one_line(e)}){where}; {why}")
    return WriteFailed(f"could not write {path}: {one_line(e)}")


def classify(e: BaseException) -> tuple[str, int, str]:
    """(class, exit code, one-line message) of a failure."""
    if isinstance(e, KeyboardInterrupt):
        return "interrupted", EXIT_CODES["interrupted"], "interrupted"
    for cls, kind in ((RunDirInUse, "locked"), (DiskFull, "disk_full"), (WriteFailed, "io"), (DataError, "data"),
                      (CheckpointError, "checkpoint"), (ConfigError, "config"), (FileNotFoundError, "config")):
        if isinstance(e, cls):
            return kind, EXIT_CODES[kind], one_line(e)
    if any(getattr(x, "errno", None) in (errno.ENOSPC, errno.EDQUOT) for x in _chain(e)):
        return "disk_full", EXIT_CODES["disk_full"], f"disk full: {one_line(e)}"
    return "internal", EXIT_CODES["internal"], one_line(e)
