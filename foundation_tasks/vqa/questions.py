"""The compact form of a VQA split: ``Questions``, a few numpy arrays (ids, offsets, answers as
indices into a ``StringTable`` of the split's distinct answer strings) instead of a Python
object per question, so DataLoader workers share the pages rather than copying them as
reference counts change; ``questions[i]`` builds one ``Question`` on demand."""
from __future__ import annotations

import operator
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from foundation_tasks.vqa.metrics import normalize_answer


@dataclass
class Question:
    question_id: int
    image_id: int
    question: str
    image: Path
    answers: Optional[list[str]] = None  # the humans' answers (None in test splits)
    answer_type: str = ""
    multiple_choice_answer: str = ""
    record: str = ""  # "FILE: question N" for error messages


# --------------------------------------------------------------------------- compact storage


def _offsets(lengths) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _gather(offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(flat indices, offsets) of the ranges ``offsets[r]:offsets[r + 1]`` of ``rows``, concatenated."""
    starts = offsets[rows]
    lengths = offsets[rows + 1] - starts
    new = _offsets(lengths)
    return np.arange(new[-1], dtype=np.int64) + np.repeat(starts - new[:-1], lengths), new


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


class StringTable:
    """Strings as one UTF-8 buffer and their offsets (no Python object per string)."""

    __slots__ = ("data", "offsets", "memo", "_normalized")

    def __init__(self, data: bytes, offsets: np.ndarray):
        self.data, self.offsets = data, _frozen(offsets)
        self.memo: Optional[dict[str, str]] = None  # normalisations already made, used by normalized()
        self._normalized: Optional[tuple[np.ndarray, list[str]]] = None

    @classmethod
    def of(cls, strings: Iterable[str]) -> "StringTable":
        encoded = [s.encode("utf-8", "surrogatepass") for s in strings]  # JSON may hold lone surrogates
        return cls(b"".join(encoded), _offsets(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> str:
        return self.data[self.offsets[i]:self.offsets[i + 1]].decode("utf-8", "surrogatepass")

    def __iter__(self):
        bounds = self.offsets.tolist()
        return (self.data[a:b].decode("utf-8", "surrogatepass") for a, b in zip(bounds[:-1], bounds[1:]))

    def take(self, rows: np.ndarray) -> "StringTable":
        index, offsets = _gather(self.offsets, rows)
        return StringTable(np.frombuffer(self.data, dtype=np.uint8)[index].tobytes(), offsets)

    def normalized(self) -> tuple[np.ndarray, list[str]]:
        """(for each string the index of its ``normalize_answer`` in the list, the list of
        distinct normalised strings): ``normalize_answer`` runs once per distinct string."""
        if self._normalized is None:
            memo, index, ids = self.memo or {}, {}, []
            for s in self:
                n = memo.get(s)
                if n is None:
                    n = normalize_answer(s)
                ids.append(index.setdefault(n, len(index)))
            self._normalized, self.memo = (_frozen(np.array(ids, dtype=np.int64)), list(index)), None
        return self._normalized


class Questions(Sequence):
    """A split's questions in a few arrays; ``questions[i]`` is a ``Question`` (made on
    demand), a slice or ``take(rows)`` another ``Questions``. Answers are indices into a
    table of the split's distinct answer strings (``strings``), ``answer_type`` indices into
    ``types``; images and records are derived from the split's file names and pattern."""

    def __init__(self, question_id: np.ndarray, image_id: np.ndarray, texts: StringTable, strings: StringTable,
                 answer_offsets: np.ndarray, answer_ids: np.ndarray, has_answers: np.ndarray, majority: np.ndarray,
                 types: list, answer_type: np.ndarray, source: Optional[tuple[str, str, str, str]] = None,
                 images: Optional[StringTable] = None, records: Optional[StringTable] = None):
        self.question_id, self.image_id = _frozen(question_id), _frozen(image_id)
        self.texts, self.strings, self.types = texts, strings, types
        self.answer_offsets, self.answer_ids = _frozen(answer_offsets), _frozen(answer_ids)
        self.has_answers, self.majority, self.answer_type = _frozen(has_answers), _frozen(majority), _frozen(answer_type)
        self.source = source  # (questions file, data_dir, split, image_pattern)
        self.images, self.records = images, records  # explicit, for questions not read from a split

    # ------------------------------------------------------------------ building

    @classmethod
    def from_questions(cls, questions: Iterable[Question]) -> "Questions":
        """From ``Question`` objects (e.g. a hand-made list): each field kept as it is."""
        questions = list(questions)
        strings: dict[str, int] = {}
        types, type_ids, ids, lengths, majority, atypes = [], {}, [], [], [], []
        for q in questions:
            answers = q.answers or []
            ids += [strings.setdefault(a, len(strings)) for a in answers]
            lengths.append(len(answers))
            majority.append(strings.setdefault(q.multiple_choice_answer, len(strings)))
            atypes.append(_type_code(q.answer_type, types, type_ids))
        n = len(questions)
        return cls(np.array([q.question_id for q in questions], dtype=np.int64),
                   np.array([q.image_id for q in questions], dtype=np.int64),
                   StringTable.of(q.question for q in questions), StringTable.of(strings),
                   _offsets(np.array(lengths, dtype=np.int64)), np.array(ids, dtype=np.int32),
                   np.array([q.answers is not None for q in questions], dtype=bool).reshape(n),
                   np.array(majority, dtype=np.int32), types, np.array(atypes, dtype=np.int32),
                   images=StringTable.of(str(q.image) for q in questions),
                   records=StringTable.of(q.record for q in questions))

    # ------------------------------------------------------------------ reading

    def __len__(self) -> int:
        return len(self.question_id)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.take(np.arange(len(self))[i])
        i = operator.index(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"question {i} of {len(self)}")
        qid, iid = int(self.question_id[i]), int(self.image_id[i])
        if self.source is not None:
            qpath, data_dir, split, pattern = self.source
            image, record = Path(data_dir) / pattern.format(split=split, image_id=iid), f"{qpath}: question {qid}"
        else:
            image, record = Path(self.images[i]), self.records[i]
        return Question(qid, iid, self.texts[i], image, self.answers_of(i), self.types[self.answer_type[i]],
                        self.strings[self.majority[i]], record)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def answers_of(self, i: int) -> Optional[list[str]]:
        if not self.has_answers[i]:
            return None
        strings = self.strings
        return [strings[j] for j in self.answer_ids[self.answer_offsets[i]:self.answer_offsets[i + 1]].tolist()]

    def take(self, rows) -> "Questions":
        """The questions ``rows`` (indices), in that order."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if len(rows) == len(self) and np.array_equal(rows, np.arange(len(self))):
            return self
        index, offsets = _gather(self.answer_offsets, rows)
        return Questions(self.question_id[rows], self.image_id[rows], self.texts.take(rows), self.strings, offsets,
                         self.answer_ids[index], self.has_answers[rows], self.majority[rows], self.types,
                         self.answer_type[rows], self.source,
                         None if self.images is None else self.images.take(rows),
                         None if self.records is None else self.records.take(rows))

    # ------------------------------------------------------------------ answers, vectorised

    def majority_counts(self) -> Counter:
        """How many questions have each normalised ``multiple_choice_answer``."""
        norm, names = self.strings.normalized()
        counts = np.bincount(norm[self.majority], minlength=len(names))
        return Counter({names[k]: int(counts[k]) for k in np.flatnonzero(counts).tolist()})

    def targets(self, index: dict[str, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``targets()`` of every question at once: (offsets, vocabulary indices, min(count, 4)),
        question i's in ``[offsets[i], offsets[i + 1])``, in the order of first mention."""
        norm, names = self.strings.normalized()
        vocab = np.array([index.get(a, -1) for a in names], dtype=np.int64)
        m = max(1, len(names))
        owner = np.repeat(np.arange(len(self), dtype=np.int64), np.diff(self.answer_offsets))
        keys, first, counts = np.unique(owner * m + norm[self.answer_ids], return_index=True, return_counts=True)
        order = np.argsort(first, kind="stable")  # by question, then first mention
        keys, counts = keys[order], counts[order]
        labels = vocab[keys % m]
        keep = labels >= 0
        offsets = _offsets(np.bincount(keys[keep] // m, minlength=len(self)))
        return offsets, labels[keep].astype(np.int32), np.minimum(counts[keep], 4).astype(np.int8)


def _type_code(value: Any, types: list, ids: dict) -> int:
    """The index of an ``answer_type`` in ``types`` (strings once each; any other JSON value as it is)."""
    if type(value) is str:
        code = ids.get(value)
        if code is None:
            code = ids[value] = len(types)
            types.append(value)
        return code
    types.append(value)
    return len(types) - 1


# --------------------------------------------------------------------------- json
