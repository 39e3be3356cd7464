"""Atomic, durable file writes: what a crash may interrupt, it never leaves half-written."""
from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Callable


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """``write`` a temporary file next to ``path``, fsync it, then rename it over ``path``:
    readers see the old file or the whole new one, never a partial one."""
    path = Path(path)
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    tmp, mode = _create_temp(directory, path.name)
    try:
        write(tmp)
        fsync_path(tmp)
        os.chmod(tmp, mode)  # writers that replace the file (safetensors: 0600) must not set its mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_path(directory)  # make the rename itself durable


def _create_temp(directory: Path, name: str) -> tuple[str, int]:
    """A new empty file ``.<name>.<random>.tmp`` in ``directory`` and its mode. It is created
    with 0666 so that the kernel applies the process umask, as for any new file (``mkstemp``'s
    0600 would outlive the rename): the mode comes without reading or changing the umask."""
    while True:
        tmp = directory / f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        try:
            mode = os.fstat(fd).st_mode & 0o777
        finally:
            os.close(fd)
        return str(tmp), mode


def fsync_path(path: str | Path) -> None:
    """fsync a file or directory; a no-op where the platform refuses."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
