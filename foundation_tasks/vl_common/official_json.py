"""The official json files of the VL data sets (VQA v2's questions and annotations, COCO's
instances), read once per process and modification time; errors name the file."""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from foundation_tasks.vl_common.images import DataError


@functools.lru_cache(maxsize=8)
def _read_json(path: str, mtime: float) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None


def read_json(path: Path, key: str) -> list:
    """The list under ``key`` of an official json file (parsed once per process and mtime)."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    data = _read_json(str(path), path.stat().st_mtime)
    if not isinstance(data, dict) or not isinstance(data.get(key), list):
        raise DataError(f"{path}: expected a JSON object with a list under {key!r}")
    return data[key]
