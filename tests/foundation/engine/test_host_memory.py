"""keep_freed_memory: a step's large blocks come from the heap and stay there, with the same arithmetic."""
import subprocess
import sys
from pathlib import Path

import pytest

from foundation.engine import host_memory

ROOT = Path(__file__).resolve().parents[3]

# In a fresh process: whether glibc serves a 24 MB block (a small batch's activation) in its own
# mapping (mallinfo's hblks, before and while it is held: a block handed back to the kernel on free,
# and faulted in and zeroed again at the next step); how far freeing 64 MB of 1 MB blocks shrinks the
# heap (glibc trims it as its moving threshold allows); a small MLP's gradients after 5 steps, to
# compare bit for bit. (Page-fault counts show the cost too, but move from process to process with
# transparent huge pages: benchmarks/host_memory.py.)
CHILD = """
import ctypes, sys, torch
from foundation.engine.host_memory import keep_freed_memory
if sys.argv[1] == "kept":
    assert keep_freed_memory()
FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
libc = ctypes.CDLL("libc.so.6")
size_t = ctypes.c_size_t if hasattr(libc, "mallinfo2") else ctypes.c_int
class Info(ctypes.Structure):
    _fields_ = [(f, size_t) for f in FIELDS]
info = getattr(libc, "mallinfo2", None) or libc.mallinfo
info.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
before = info().hblks
block = libc.malloc(24 << 20)
mapped = info().hblks - before
libc.free(block)
blocks = [libc.malloc(1 << 20) for _ in range(64)]
held = info().arena
for b in blocks[::-1]:
    libc.free(b)
shrunk = held - info().arena
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
x = torch.randn(16384, 64)
for _ in range(5):
    model(x).square().mean().backward()
print(mapped, shrunk >> 20, repr(sum(p.grad.double().sum().item() for p in model.parameters())))
"""


def child(mode: str) -> list[str]:
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}  # no MALLOC_* of the caller's
    done = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, env=env, check=True)
    return done.stdout.split()


@pytest.mark.skipif(not (sys.platform.startswith("linux") and host_memory.glibc() is not None),
                    reason="glibc's malloc only")
def test_kept_memory_serves_large_blocks_from_a_heap_that_stays_and_moves_no_arithmetic():
    mapped, _, grads = child("glibc")
    assert mapped == "1"  # glibc's default: its own mapping
    assert child("kept") == ["0", "0", grads]  # from the heap, which stays; the same gradients bit for bit


def test_a_users_own_malloc_settings_win(monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert host_memory.user_settings() == ["MALLOC_TRIM_THRESHOLD_"]
    assert host_memory.keep_freed_memory() is False
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    assert host_memory.user_settings({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}) == ["GLIBC_TUNABLES"]
    assert host_memory.user_settings({"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=512", "MALLOC": "x"}) == []


def test_every_foundation_command_keeps_freed_memory(monkeypatch, capsys):
    from foundation.cli import main

    calls = []
    monkeypatch.setattr(host_memory, "keep_freed_memory", lambda: calls.append(1) or True)
    assert main(["--help"]) == 0
    assert calls == [1]
