"""NLVR2 read from its official layout (lil-lab/nlvr, ``nlvr2/data``), as downloaded::

    DATA_DIR/data/{train,dev,test1}.json            one JSON object per line:
        {"identifier": "train-10171-0-0", "sentence": "...", "label": "True",
         "directory": 45 (train only), "left_url": ..., "right_url": ..., "writer": ..., ...}
    IMAGE_DIR/images/train/<directory>/train-10171-0-img0.png, ...-img1.png
    IMAGE_DIR/dev/dev-...-img{0,1}.png      IMAGE_DIR/test1/test1-...-img{0,1}.png

The images of a record are its identifier without the last ``-<sentence>`` part plus
``-img0.png`` (left) and ``-img1.png`` (right), as BEiT-3's index builder reads them.
A malformed line, a label that is not "True" / "False" and a missing image are errors
naming the file and line.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch.utils.data import Dataset

from foundation.engine.data import item_seed
from foundation_tasks.vision_common.images import DecodedImages
from foundation_tasks.vl_common.images import DataError, load_image, transform_image
from foundation_tasks.vl_common.text import EncodedTexts, Tokenizer, pad_texts

IMAGE_SUBDIRS = {"train": "images/train"}  # other splits: the split name


@dataclass
class Statement:
    identifier: str
    sentence: str
    label: int  # 1 = True
    left: Path
    right: Path
    record: str


def read_split(data_dir: str | Path, image_dir: str | Path, split: str) -> list[Statement]:
    path = Path(data_dir) / "data" / f"{split}.json"
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(rec, dict):
            raise DataError(f"{where}: expected a JSON object")
        for key in ("identifier", "sentence", "label"):
            if not isinstance(rec.get(key), str):
                raise DataError(f"{where}: field {key!r} must be a string, got {rec.get(key)!r}")
        where = f"{where} ({rec['identifier']})"
        if rec["label"] not in ("True", "False"):
            raise DataError(f"{where}: field 'label' must be \"True\" or \"False\", got {rec['label']!r}")
        parts = rec["identifier"].rsplit("-", 1)
        if len(parts) != 2:
            raise DataError(f"{where}: identifier {rec['identifier']!r} is not <split>-<set>-<pair>-<sentence>")
        folder = Path(image_dir) / IMAGE_SUBDIRS.get(split, split)
        if "directory" in rec:
            folder = folder / str(rec["directory"])
        left, right = (folder / f"{parts[0]}-img{k}.png" for k in (0, 1))
        for image in (left, right):
            if not image.is_file():
                raise DataError(f"{where}: image not found: {image}")
        out.append(Statement(rec["identifier"], rec["sentence"], int(rec["label"] == "True"), left, right, where))
    if not out:
        raise DataError(f"{path}: no records")
    return out


class NLVR2Dataset(Dataset):
    def __init__(self, statements: Sequence[Statement], tokenizer: Tokenizer, max_text_len: int, transform: Callable,
                 random_transform: bool = False, cache_images: bool = False):
        self.statements, self.tokenizer, self.max_text_len = list(statements), tokenizer, max_text_len
        self.decoded, self.encode = DecodedImages(cache_images), EncodedTexts(tokenizer, max_text_len)
        self.transform, self.random_transform = transform, random_transform  # random: seeded per item

    def __len__(self) -> int:
        return len(self.statements)

    def __getitem__(self, i: int) -> dict[str, Any]:
        s = self.statements[i]
        seed = item_seed(i, True) if self.random_transform else None
        images = [transform_image(self.transform, self.decoded.get(p, lambda p=p: load_image(p, s.record)),
                                  None if seed is None else seed + k, s.record)
                  for k, p in enumerate((s.left, s.right))]
        try:
            ids = self.encode(s.sentence)
        except ValueError as e:
            raise DataError(f"{s.record}: {e}") from None
        return {"left": images[0], "right": images[1], "text": ids, "label": s.label}


def collate(samples: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    ids, pad = pad_texts([s["text"] for s in samples], pad_id)
    return {"left": torch.stack([s["left"] for s in samples]), "right": torch.stack([s["right"] for s in samples]),
            "text_ids": ids, "text_padding_mask": pad, "labels": torch.as_tensor([s["label"] for s in samples])}
