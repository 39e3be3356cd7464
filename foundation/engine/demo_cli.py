"""The command line every demo data generator shares (``foundation data make NAME``, one
``main(argv)`` per task that owns a demo data set): the parser with ``--out``, ``--force``
and ``--seed``, refusing a non-empty, unwritable or non-folder output directory (or
replacing a non-empty one with ``--force``, the one flag of every generator), timing the
write, and errors printed as ``foundation data make NAME: ...`` with exit status 2.

The generators themselves (what they draw, synthesise and write) stay in their tasks. A
generator declares its data set in its own ``demo.py``, found by convention like tasks and
recipes (no table lists them), as a literal read without importing the module (so listing
the data sets costs nothing and needs no task's extra)::

    DEMO_DATA = {"name": "vision", "folder": "vision-demo"}   # foundation data make vision
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Optional

PROG = "foundation data make"


@dataclass(frozen=True)
class DemoData:
    name: str  # foundation data make NAME
    folder: str  # its folder under the demo's data/ (the configs' default data paths)
    module: str  # the generator: main(argv) -> exit status


def demo_data_sets() -> dict[str, DemoData]:
    """Every ``DEMO_DATA`` of a ``demo.py`` in a package of the task package, by name."""
    from foundation.engine.task import TASKS_PACKAGE

    spec = importlib.util.find_spec(TASKS_PACKAGE)
    found: dict[str, DemoData] = {}
    for root in (spec.submodule_search_locations or []) if spec else []:
        for path in sorted(Path(root).glob("*/demo.py")):
            for node in ast.parse(path.read_text(), str(path)).body:
                if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["DEMO_DATA"]:
                    fields = ast.literal_eval(node.value)
                    module = f"{TASKS_PACKAGE}.{path.parent.name}.demo"
                    found.setdefault(fields["name"], DemoData(fields["name"], fields["folder"], module))
    return dict(sorted(found.items()))


def demo_parser(name: str, description: str, *, out_help: str = "output directory",
                **kwargs: Any) -> argparse.ArgumentParser:
    """``foundation data make NAME``'s parser, with ``--out`` (required), ``--force`` (replace
    a non-empty ``--out``, see ``free_out``) and ``--seed`` (0)."""
    p = argparse.ArgumentParser(prog=f"{PROG} {name}", description=description, **kwargs)
    p.add_argument("--out", type=Path, required=True, help=out_help)
    p.add_argument("--force", action="store_true", help="replace OUT if it already holds files (deletes them)")
    p.add_argument("--seed", type=int, default=0)
    return p


def item_count(text: str) -> int:
    """argparse type of a number of items: a whole number >= 1 (an empty split would only fail later, in training)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def fail(name: str, message: str) -> int:
    """Say what went wrong, naming the command; the exit status for it."""
    print(f"{PROG} {name}: {message}", file=sys.stderr)
    return 2


def free_out(name: str, out: Path, replace: bool) -> bool:
    """Whether ``out`` may be written, created now: missing or empty, or emptied now because
    ``replace`` (``--force``) was given. A full one is refused, saying so, as writing into it
    would mix two data sets (or replace a real one's files); a file or a folder that cannot
    be written is refused too, each in one line."""
    try:
        if out.exists() and not out.is_dir():
            fail(name, f"--out {out} is a file; give a folder")
            return False
        if out.exists() and any(out.iterdir()):
            if not replace:
                fail(name, f"--out {out} is not empty; pass --force to replace it (its files are deleted)")
                return False
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(name, f"--out {out}: {e.strerror or e}")
        return False
    if not os.access(out, os.W_OK | os.X_OK):  # a read-only folder (or file system)
        fail(name, f"--out {out}: not writable")
        return False
    return True


def timed(name: str, write: Callable[[], Any],
          errors: tuple[type[BaseException], ...] = ()) -> Optional[tuple[Any, float]]:
    """``(write(), seconds it took)``; None, after saying why, when it raises one of ``errors``
    (what the user can fix: a missing tool, a bad size)."""
    start = time.perf_counter()
    try:
        result = write()
    except errors as e:
        fail(name, str(e))
        return None
    return result, time.perf_counter() - start
