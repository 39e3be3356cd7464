"""Keep freed host memory in the process instead of handing it back to the kernel at every step.

glibc's malloc serves large blocks (above ~128 KB, a threshold it raises as blocks are freed, up
to 32 MB) with fresh ``mmap`` pages and returns them on ``free``, and trims the heap's free top
beyond twice that. A CPU training step allocates and frees the same activation and gradient
tensors every step, so each step faults its memory back in page by page and the kernel zeroes
every page: on the tiny vision, segmentation and VQA recipes thousands of page faults a step
and up to a fifth of the step's CPU time (``benchmarks/host_memory.py``). Fixed thresholds keep
those pages mapped, as tcmalloc or jemalloc would; those need a system package and
``LD_PRELOAD`` set before the process starts (PyTorch's CPU tuning guide), hence glibc's own
``mallopt``. It moves no arithmetic (PyTorch aligns every tensor to 64 bytes whichever way malloc
got the memory); the process keeps up to its peak use (the demo: 2.23 GB peak against 2.17).

A user's own glibc settings (``MALLOC_*_`` variables, ``GLIBC_TUNABLES``) win: then nothing is
changed. Elsewhere than glibc (macOS, musl) this does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
# blocks up to this size come from the heap: glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit); larger ones
# (a paper-size batch's activations) are mmapped, and cost their faults once per step against far more arithmetic
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30  # the heap's free top goes back to the kernel only beyond 1 GB
TOP_PAD = 64 << 20  # and grows by at least 64 MB at a time


def user_settings(environ=None) -> list[str]:
    """The glibc malloc settings the environment already makes."""
    environ = os.environ if environ is None else environ
    found = [k for k in environ if k.startswith("MALLOC_") and k.endswith("_")]
    if "malloc" in environ.get("GLIBC_TUNABLES", ""):
        found.append("GLIBC_TUNABLES")
    return found


def glibc():
    """This process's C library where it is glibc (``ctypes.CDLL``), else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    # musl and others have no gnu_get_libc_version (musl's mallopt does nothing)
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None


def keep_freed_memory() -> bool:
    """Fix glibc's mmap and trim thresholds for this process (and the processes it forks); whether it did."""
    if not sys.platform.startswith("linux") or user_settings():
        return False
    libc = glibc()
    if libc is None:
        return False
    # mallopt returns 1 on success; each of these turns off glibc's moving threshold
    return all([libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD), libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                libc.mallopt(M_TOP_PAD, TOP_PAD)])
