"""The three kinds of data of BEiT-3's masked data modeling, each in a common layout:

* ``text``:  a plain text file, one sentence (or passage) per line.
* ``image``: a folder of images (searched recursively: ImageNet folders, COCO's train2014/).
* ``pair``:  COCO captions (``annotations/captions_<split>.json``: ``images`` with ``id`` and
  ``file_name``, ``annotations`` with ``image_id`` and ``caption``), images in a folder.
* ``match``: the same captions, unmasked; an item carries its own caption or, half the time,
  another image's caption that is none of its own (image-text matching).

Items carry their masks, drawn per item (see ``foundation.engine.data.item_seed``; new
masks every epoch in training, the same ones at every evaluation):
texts BERT-masked at ``text_ratio``, images block-masked at ``image_ratio`` of the patches.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch.utils.data import Dataset

from foundation.engine.data import item_seed
from foundation_tasks.vl_common.images import DataError, load_image, transform_image
from foundation_tasks.vl_common.text import Tokenizer, pad_texts
from foundation_tasks.vl_pretrain.masking import MaskingGenerator, mask_text

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
KINDS = ("text", "image", "pair", "match")


def read_lines(path: str | Path) -> list[tuple[str, str]]:
    """(text, record) of the non-empty lines of a text file."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: text file not found")
    lines = [(l.strip(), f"{path}:{n}") for n, l in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if l.strip()]
    if not lines:
        raise DataError(f"{path}: no text")
    return lines


def find_images(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: image folder not found")
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not files:
        raise DataError(f"{folder}: no images ({', '.join(IMAGE_SUFFIXES)})")
    return files


def read_captions(path: str | Path, image_dir: str | Path) -> list[tuple[Path, str, str]]:
    """(image, caption, record) of a COCO captions file; images are checked to exist."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: captions file not found")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    if not isinstance(data, dict) or not isinstance(data.get("images"), list) or not isinstance(data.get("annotations"), list):
        raise DataError(f"{path}: expected COCO captions: an object with 'images' and 'annotations' lists")
    files = {}
    for i, im in enumerate(data["images"]):
        if not isinstance(im, dict) or not isinstance(im.get("id"), int) or not isinstance(im.get("file_name"), str):
            raise DataError(f"{path}: images[{i}]: expected {{'id': int, 'file_name': str, ...}}, got {im!r}")
        files[im["id"]] = Path(image_dir) / im["file_name"]
    out = []
    for i, ann in enumerate(data["annotations"]):
        where = f"{path}: annotations[{i}]"
        if not isinstance(ann, dict) or not isinstance(ann.get("image_id"), int) or not isinstance(ann.get("caption"), str):
            raise DataError(f"{where}: expected {{'image_id': int, 'caption': str, ...}}, got {ann!r}")
        if ann["image_id"] not in files:
            raise DataError(f"{where}: image_id {ann['image_id']} is not in 'images'")
        image = files[ann["image_id"]]
        if not image.is_file():
            raise DataError(f"{where} (image_id {ann['image_id']}): image not found: {image}")
        out.append((image, ann["caption"], where))
    if not out:
        raise DataError(f"{path}: no captions")
    return out


class MaskedDataset(Dataset):
    """Items of one kind with their masks: ``texts`` (text, record) for ``text``, ``images``
    for ``image``, (image, caption, record) ``pairs`` for ``pair``."""

    def __init__(self, kind: str, records: list, *, tokenizer: Tokenizer, max_text_len: int, transform: Callable,
                 train: bool, text_ratio: float, image_masking: Optional[MaskingGenerator], random_transform: bool = False,
                 prefer_pieces: frozenset[int] = frozenset()):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if kind == "match":  # each image's own captions: a negative is a caption none of them equals
            self.own: dict[Path, set[str]] = {}
            for image, caption, _ in records:
                self.own.setdefault(image, set()).add(caption)
            if len({c for _, c, _ in records}) <= max(map(len, self.own.values()), default=0):
                raise DataError(f"{records[0][2] if records else 'captions'}: image-text matching needs a caption "
                                "that does not describe the image, for every image")
        self.kind, self.records, self.tokenizer, self.max_text_len = kind, records, tokenizer, max_text_len
        self.transform, self.train, self.text_ratio, self.image_masking = transform, train, text_ratio, image_masking
        self.random_transform, self.prefer_pieces = random_transform, prefer_pieces

    def __len__(self) -> int:
        return len(self.records)

    def _text(self, text: str, record: str, rng: np.random.Generator) -> dict[str, Any]:
        tok = self.tokenizer
        try:
            ids = tok.encode(text, self.max_text_len)
        except ValueError as e:
            raise DataError(f"{record}: {e}") from None
        masked_ids, masked = mask_text(ids, self.text_ratio, rng, mask_id=tok.mask_id,
                                       vocab=(tok.first_piece, tok.mask_id), special=(tok.bos_id, tok.eos_id),
                                       prefer=self.prefer_pieces)
        return {"text": masked_ids, "text_target": ids, "text_masked": masked}

    def _image(self, path: Path, record: str, rng: np.random.Generator, seed: int) -> dict[str, Any]:
        image = transform_image(self.transform, load_image(path, record), seed if self.random_transform else None, record)
        return {"image": image, "vision_mask": torch.from_numpy(self.image_masking(rng).reshape(-1))}

    def __getitem__(self, i: int) -> dict[str, Any]:
        seed = item_seed(i, self.train)
        rng = np.random.default_rng(seed)
        if self.kind == "text":
            text, record = self.records[i]
            return self._text(text, record, rng)
        if self.kind == "image":
            path = self.records[i]
            return self._image(path, str(path), rng, seed)
        path, caption, record = self.records[i]
        if self.kind == "match":
            matched, text_record = bool(rng.random() < 0.5), record
            while not matched:  # another image's caption, drawn until it is none of this image's
                _, caption, text_record = self.records[int(rng.integers(len(self.records)))]
                if caption not in self.own[path]:
                    break
            image = transform_image(self.transform, load_image(path, record), seed if self.random_transform else None, record)
            try:
                ids = self.tokenizer.encode(caption, self.max_text_len)
            except ValueError as e:
                raise DataError(f"{text_record}: {e}") from None
            return {"image": image, "text": ids, "match": int(matched)}
        return {**self._image(path, record, rng, seed), **self._text(caption, record, rng)}


def collate(samples: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    batch = {}
    if "text" in samples[0]:
        batch["text_ids"], batch["text_padding_mask"] = pad_texts([s["text"] for s in samples], pad_id)
    if "text_target" in samples[0]:
        batch["text_targets"], _ = pad_texts([s["text_target"] for s in samples], pad_id)
        batch["text_masked"] = pad_texts([[int(m) for m in s["text_masked"]] for s in samples], 0)[0].bool()
    if "image" in samples[0]:
        batch["images"] = torch.stack([s["image"] for s in samples])
    if "vision_mask" in samples[0]:
        batch["vision_mask"] = torch.stack([s["vision_mask"] for s in samples])
    if "match" in samples[0]:
        batch["match_labels"] = torch.tensor([s["match"] for s in samples])
    return batch
