"""keep_freed_memory: a training step stops faulting its memory back in, with the same arithmetic."""
import subprocess
import sys
from pathlib import Path

import pytest

from foundation.engine import host_memory

ROOT = Path(__file__).resolve().parents[3]

# a small MLP's training step on a batch whose activations are 1-4 MB, as a tiny recipe's are
CHILD = """
import resource, sys, torch
from foundation.engine.host_memory import keep_freed_memory
if sys.argv[1] == "kept":
    assert keep_freed_memory()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
x = torch.randn(4096, 64)
def step():
    model(x).square().mean().backward()
for _ in range(3):
    step()
start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) / 20
print(faults, repr(sum(p.grad.double().sum().item() for p in model.parameters())))
"""


def child(mode: str) -> tuple[float, str]:
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}  # no MALLOC_* of the caller's
    done = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, env=env, check=True)
    faults, grads = done.stdout.split()
    return float(faults), grads


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")
def test_kept_memory_stops_the_page_faults_and_moves_no_arithmetic():
    glibc, grads = child("glibc")
    kept, kept_grads = child("kept")
    assert glibc > 500, f"glibc's default faulted only {glibc} pages a step: the probe no longer shows the cost"
    assert kept * 5 < glibc, (kept, glibc)
    assert kept_grads == grads  # bit for bit


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
