"""The official json files of the VL data sets (VQA v2's questions and annotations, COCO's
instances), read once per process and modification time; errors name the file.

``read_json`` keeps the parsed document (small files, read by several readers);
``read_json_records`` hands the records of one list to a consumer as it parses, a piece of
the file at a time, so that a large file (VQA v2's 356 MB of train annotations, 1.7 GB as
Python objects) is never held whole, parsed or not.
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any, Callable, Protocol, TypeVar

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


# --------------------------------------------------------------------------- streamed records


class Records(Protocol):
    def add(self, i: int, record: Any) -> None:
        """Take record ``i`` of the list (raise ``DataError`` naming it if it is malformed)."""


R = TypeVar("R", bound=Records)
_WS = re.compile(r"[ \t\n\r]*")
_SEP = re.compile(r"[ \t\n\r]*([,\]])[ \t\n\r]*")
_DECODER = json.JSONDecoder()
CHUNK = 1 << 23  # characters read at a time


class _Unusual(Exception):
    """Not the plain layout the streaming reader follows: the whole file is parsed instead."""


class _Text:
    """A window on a text file: ``text[pos:]`` is what is not consumed yet."""

    def __init__(self, f, chunk: int):
        self.f, self.chunk, self.text, self.pos, self.eof = f, chunk, "", 0, False

    def more(self) -> bool:
        if self.eof:
            return False
        data = self.f.read(max(self.chunk, len(self.text) - self.pos))  # a long value: the window doubles
        if not data:
            self.eof = True
            return False
        self.text = self.text[self.pos:] + data
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next non-blank character ('' at the end)."""
        while True:
            self.pos = _WS.match(self.text, self.pos).end()
            if self.pos < len(self.text) or not self.more():
                return self.text[self.pos:self.pos + 1]

    def take(self, char: str) -> None:
        if self.peek() != char:
            raise _Unusual
        self.pos += 1

    def value(self) -> Any:
        while True:
            self.peek()
            try:
                value, end = _DECODER.raw_decode(self.text, self.pos)
            except (json.JSONDecodeError, RecursionError):
                if self.more():
                    continue
                raise _Unusual from None
            if len(self.text) - end < 64 and self.more():  # a number or literal may go on in the next piece
                continue
            self.pos = end
            return value


def _stream(text: _Text, key: str, make: Callable[[], R]) -> R:
    records, error = None, None
    text.take("{")
    while True:
        if text.peek() != '"':
            raise _Unusual
        name = text.value()
        text.take(":")
        if name == key and text.peek() == "[":
            records, error = make(), None  # a repeated key: the last one counts, as for json.load
            text.take("[")
            if text.peek() == "]":
                text.pos += 1
            else:
                i, add, decode, sep_at = 0, records.add, _DECODER.raw_decode, _SEP.match
                while True:
                    try:  # the common case inline: a whole record, its separator, well inside the window
                        record, end = decode(text.text, text.pos)
                        if len(text.text) - end < 64:
                            raise ValueError
                    except (ValueError, RecursionError):
                        record = text.value()
                        end = text.pos
                    if error is None:
                        try:
                            add(i, record)
                        except DataError as e:  # raised once the whole file is known to be JSON
                            error = e
                    i += 1
                    m = sep_at(text.text, end)
                    if m is not None and m.end() < len(text.text):
                        text.pos = m.end()
                        if m.group(1) == "]":
                            break
                        continue
                    text.pos = end
                    sep = text.peek()
                    text.pos += 1
                    if sep == "]":
                        break
                    if sep != ",":
                        raise _Unusual
        else:
            if name == key:
                records = None
            text.value()
        sep = text.peek()
        text.pos += 1
        if sep == "}":
            break
        if sep != ",":
            raise _Unusual
    if text.peek() != "" or records is None:
        raise _Unusual
    if error is not None:
        raise error
    return records


def read_json_records(path: Path, key: str, make: Callable[[], R], chunk: int = CHUNK) -> R:
    """``make()``'s consumer fed, in order, the records of the list under ``key`` of the json
    object in ``path``, parsed a piece at a time: the file is never held whole, nor its parsed
    document. The errors are ``read_json``'s, in the same order: the file's (missing, not JSON,
    not an object with a list under ``key``) before any of a record's."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        with open(path, encoding="utf-8") as f:
            return _stream(_Text(f, chunk), key, make)
    except _Unusual:  # not JSON, another structure, or a layout the stream does not follow: as read_json
        pass
    data = _read_json.__wrapped__(str(path), 0.0)
    if not isinstance(data, dict) or not isinstance(data.get(key), list):
        raise DataError(f"{path}: expected a JSON object with a list under {key!r}")
    records = make()
    for i, record in enumerate(data[key]):
        records.add(i, record)
    return records
