"""Use a trained model on your own files: ``foundation predict`` and ``load_predictor``.

    p = foundation.load_predictor("checkpoints/asr-tiny-magneto")   # run dir, best/, ckpt/step_*, or a file
    p("a.wav")                       # -> {"input": "a.wav", "text": "..."}
    p(["a.wav", "b.flac"])           # -> [record, record], in batches
    p("folder/")                     # every file of the input kind under it, in batches

The model, its preprocessing and what its outputs mean come from the model file alone:
``foundation train`` writes each task's ``export_meta()`` into every model file
(``foundation.checkpoint``), and the task's ``predictor(head, backbone, meta, device)``
builds a ``Predictor`` from it. ``foundation`` imports no task: the file names its tasks,
and they are found by name as configs name them. A task without a predictor (seq2seq,
MIM, pretraining) is refused with a line that says so.

The model file is checked before anything is built from it: its config against its
tensors' shapes (``foundation.checkpoint``), the prediction metadata against that config
and sane bounds (``check_meta``, ``image_side``); a forged file is one ``CheckpointError``
line.

A ``Predictor`` reads one input at a time (``load``: an ``InputError`` naming the file for
anything it cannot use) and runs the model on batches of them (``predict``); the runner
here expands folders, batches, shows a progress bar on stderr, and keeps the input order.
"""
from __future__ import annotations

import abc
import argparse
import contextlib
import json
import math
import sys
import warnings
from pathlib import Path
from typing import Any, ClassVar, Iterator, Mapping, Sequence

import torch

from foundation.engine.task import NoPredictor  # raised here; defined beside the Task hook that raises it too

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# what soundfile (libsndfile) reads
AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".opus", ".mp3", ".aiff", ".aif", ".au", ".sph", ".w64", ".caf")
MAX_BEAM = 64  # ASR beam search: far past any useful width; 100000 ran for minutes on a 50 ms clip
MAX_IMAGE_SIDE = 4096  # px: the largest side a model file may have its inputs resized to
# an input image with more pixels is refused from its header: a 48 MP phone photo passes, and
# PIL's decompression-bomb warning (89 MP) is never reached
MAX_IMAGE_PIXELS = 64_000_000


class InputError(ValueError):
    """An input cannot be used (unreadable, empty, the wrong kind); the message names it."""


class Predictor(abc.ABC):
    """One trained task as ``inputs -> records`` (see the module docstring)."""

    input_kind: ClassVar[str] = "image"  # what one input is, for messages and folder expansion
    extensions: ClassVar[tuple[str, ...]] = IMAGE_EXTENSIONS
    required: ClassVar[tuple[str, ...]] = ()  # options every call needs, e.g. ("question",)
    pairs: ClassVar[bool] = False  # one input is two files (NLVR2)
    default_batch_size: ClassVar[int] = 16

    def __init__(self, task: Any, head: torch.nn.Module, backbone: torch.nn.Module, meta: Mapping[str, Any],
                 device: torch.device):
        self.task, self.head, self.backbone, self.meta, self.device = task, head, backbone, meta, device

    @abc.abstractmethod
    def load(self, source: Any, **options) -> Any:
        """One input (a path, or a pair of paths) read and preprocessed; ``InputError`` naming it."""

    @abc.abstractmethod
    def predict(self, items: list, **options) -> list[dict]:
        """Records (without ``input``) for a batch of what ``load`` returned."""

    @abc.abstractmethod
    def describe(self, record: Mapping[str, Any]) -> str:
        """A record as one readable line (without the input's name)."""

    # ------------------------------------------------------------------ running

    def __call__(self, inputs: Any, *, batch_size: int | None = None, progress: bool = False, **options):
        """A record for one input, a list of records for a list (or a folder). Raises
        ``InputError`` at the first input it cannot use."""
        single = not isinstance(inputs, list) and not (isinstance(inputs, (str, Path)) and Path(inputs).is_dir())
        records = []
        for record in self.run(inputs if isinstance(inputs, list) else [inputs], batch_size=batch_size,
                               progress=progress, **options):
            if "error" in record:
                raise InputError(record["error"])
            records.append(record)
        return records[0] if single else records

    def check_options(self, options: Mapping[str, Any]) -> None:
        for name in ("top_k", "beam", "chunk_seconds"):
            if options.get(name) is not None and not (0 < options[name] < math.inf):  # nan fails both
                raise InputError(f"--{name.replace('_', '-')} must be a finite number > 0, got {options[name]}")
        if options.get("beam") is not None and options["beam"] > MAX_BEAM:
            raise InputError(f"--beam must be at most {MAX_BEAM} (search time grows with it), got {options['beam']}")
        missing = [name for name in self.required if not options.get(name)]
        if missing:
            flags = ", ".join(f"--{m}" for m in missing)
            raise InputError(f"a {self.task.name} model needs {' and '.join(repr(m) for m in missing)} with every "
                             f"input (command line: {flags})")

    def expand(self, inputs: Sequence[Any]) -> list[Any]:
        """Folders replaced by their files of this input kind (sorted, recursively); pairs
        for a pair model: given as tuples, or consecutive files of a flat list."""
        flat: list[Any] = []
        for x in inputs:
            if isinstance(x, (str, Path)) and Path(x).is_dir():
                found = sorted(p for p in Path(x).rglob("*") if p.is_file() and p.suffix.lower() in self.extensions)
                if not found:
                    raise InputError(f"{x}: no {self.input_kind} files in this folder "
                                     f"({', '.join(self.extensions[:4])}, ...)")
                flat += [str(p) for p in found]
            else:
                flat.append(tuple(str(p) for p in x) if isinstance(x, (tuple, list)) else str(x))
        if not self.pairs:
            return flat
        if all(isinstance(x, tuple) for x in flat):
            return flat
        if any(isinstance(x, tuple) for x in flat) or len(flat) % 2:
            raise InputError(f"a {self.task.name} model takes images in pairs (left right): got {len(flat)} "
                             f"image(s): {', '.join(str(x) for x in flat[:4])}")
        return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]

    def run(self, inputs: Sequence[Any], *, batch_size: int | None = None, progress: bool = False,
            **options) -> Iterator[dict]:
        """Records in input order; an input that cannot be used gives ``{"input", "error"}``."""
        from tqdm import tqdm

        self.check_options(options)
        items = self.expand(inputs)
        size = batch_size or self.default_batch_size
        if size < 1:
            raise InputError(f"batch size must be >= 1, got {size}")
        # disable=None: no bar where stderr is not a terminal (logs, pipes)
        with tqdm(total=len(items), disable=None if progress and len(items) > 1 else True, file=sys.stderr,
                  unit=self.input_kind, dynamic_ncols=True, leave=False) as bar, torch.inference_mode():
            for start in range(0, len(items), size):
                batch = items[start:start + size]
                loaded, slots = [], []
                out: list[dict | None] = [None] * len(batch)
                for k, source in enumerate(batch):
                    try:
                        loaded.append(self.load(source, **options))
                        slots.append(k)
                    except InputError as e:
                        out[k] = {"input": _name(source), "error": str(e)}
                for k, record in zip(slots, self.predict(loaded, **options) if loaded else []):
                    out[k] = {"input": _name(batch[k]), **record}
                bar.update(len(batch))
                yield from out


def _name(source: Any) -> Any:
    return list(source) if isinstance(source, tuple) else source


# --------------------------------------------------------------------------- loading


def load_predictor(source: str | Path, task: str | None = None, device: str | torch.device | None = None) -> Predictor:
    """The predictor of a trained run: ``source`` is a run directory (its best/, else its
    last checkpoint), a checkpoint directory or a ``model.safetensors``; ``task`` picks a
    task id when the model has several with a predictor; ``device`` defaults to CUDA when
    there is one."""
    from foundation import checkpoint
    from foundation.checkpoint import CheckpointError
    from foundation.engine.run_state import model_file
    from foundation.engine.model import MultiTaskModel

    path = model_file(source)
    model = checkpoint.load(path)
    if not isinstance(model, MultiTaskModel):
        raise NoPredictor(f"{path} holds a {type(model).__name__}, not a model trained by `foundation train` "
                          "(predict needs a run's model.safetensors: its tasks say what the outputs mean)")
    ids = list(model.tasks)
    if task is not None and task not in ids:
        raise NoPredictor(f"{path}: no task {task!r} in this model (tasks: {', '.join(ids)})")
    candidates = [task] if task else [t for t in ids if _has_predictor(model.tasks[t])]
    if not candidates:
        names = ", ".join(f"{t} ({model.tasks[t].name})" for t in ids)
        raise NoPredictor(f"{path}: no task of this model has a predictor (its tasks: {names}); foundation predict "
                          "serves classification, segmentation, asr, vqa and nlvr2 runs")
    if len(candidates) > 1:
        raise NoPredictor(f"{path}: several tasks can predict ({', '.join(candidates)}); pick one with --task ID")
    tid = candidates[0]
    meta = (model.saved_meta or {}).get(tid)
    if meta is None:
        raise NoPredictor(f"{path} carries no prediction metadata for task {tid!r} (export_meta); "
                          "it was not written by `foundation train`")
    try:
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as e:
        raise NoPredictor(f"--device {device!r}: {e}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise NoPredictor("--device cuda: no CUDA device is available here")
    check_meta(path, tid, model.tasks[tid], meta)
    model.to(dev).eval()
    try:
        return model.tasks[tid].predictor(model.heads[tid], model.backbone, meta, dev)
    except NoPredictor:
        raise
    except (KeyError, TypeError, ValueError) as e:  # a predictor refusing (or tripping on) what the file says
        problem = f"no {e}" if isinstance(e, KeyError) else str(e)
        raise CheckpointError(f"{path}: the prediction metadata of task {tid!r} is not usable: {problem}") from None


def check_meta(path: Path, tid: str, task: Any, meta: Any) -> None:
    """The prediction metadata of task ``tid`` is a mapping, and every setting that its task's
    config also holds (img_size, max_text_len, sample_rate ...) is the config's, which the
    weights' shapes were checked against: a forged ``img_size: 20000`` would have every input
    resized to it. (Bytes are files the metadata carries, e.g. the sentencepiece model whose
    path the config names; what only the metadata holds, each predictor bounds: ``image_side``.)"""
    from dataclasses import fields

    from foundation.checkpoint import CheckpointError

    if not isinstance(meta, Mapping):
        raise CheckpointError(f"{path}: the prediction metadata of task {tid!r} is a {type(meta).__name__}, "
                              "not a mapping")
    for key in sorted(set(meta) & {f.name for f in fields(task.cfg)}):
        if not isinstance(meta[key], bytes) and meta[key] != getattr(task.cfg, key):
            raise CheckpointError(f"{path}: the prediction metadata {tid}.{key} is {meta[key]!r:.60}, but the "
                                  f"model's config says {getattr(task.cfg, key)!r:.60}")


def image_side(name: str, value: Any) -> int:
    """``value`` (a model file's ``name``) as an image side in 1..MAX_IMAGE_SIDE pixels; a
    ValueError naming it otherwise (load_predictor turns it into a CheckpointError)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value <= MAX_IMAGE_SIDE:
        raise ValueError(f"{name} is {value!r:.40}; an image side in 1..{MAX_IMAGE_SIDE} px was expected")
    return int(value)


def _has_predictor(task: Any) -> bool:
    from foundation.engine.task import Task

    return type(task).predictor is not Task.predictor


# --------------------------------------------------------------------------- command line

EXAMPLES = """\
examples:
  foundation predict checkpoints/vision-ft-tiny-magneto cat.jpg photos/ --top-k 3
  foundation predict checkpoints/seg-tiny-magneto street.jpg --out masks/
  foundation predict checkpoints/asr-tiny-magneto/best talk.flac --beam 4
  foundation predict checkpoints/vqa-tiny-magneto scene.png --question "what color is the cube?"
  foundation predict checkpoints/nlvr2-tiny-magneto left.png right.png --sentence "there are two spheres"
"""


def predict_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="foundation predict", formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Run a trained model on your own files: images (classification, "
                                            "segmentation, VQA, NLVR2 pairs) or audio (ASR).", epilog=EXAMPLES)
    p.add_argument("model", metavar="RUN_DIR|MODEL_FILE",
                   help="a run directory (best/, else the last checkpoint), a checkpoint directory or a .safetensors")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="files or folders (NLVR2: images in pairs)")
    p.add_argument("--out", help="where segmentation writes its masks and overlays (default: predictions/)")
    p.add_argument("--json", action="store_true", help="one JSON object per input on stdout")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    p.add_argument("--task", help="the task id, for a model with several tasks that can predict")
    p.add_argument("--batch-size", type=int, help="inputs per forward pass (default: the task's)")
    p.add_argument("--top-k", type=int, help="classification: classes to list (5); VQA: answers (5)")
    p.add_argument("--beam", type=int, help="ASR: beam search with this beam (default: greedy)")
    p.add_argument("--chunk-seconds", type=float, help="ASR: long audio is cut into pieces of at most this (30)")
    p.add_argument("--question", help="VQA: the question asked of every image")
    p.add_argument("--sentence", help="NLVR2: the statement judged of every image pair")
    a = p.parse_args(argv)
    options = {k: v for k, v in dict(out=a.out, top_k=a.top_k, beam=a.beam, chunk_seconds=a.chunk_seconds,
                                     question=a.question, sentence=a.sentence).items() if v is not None}
    from tqdm import tqdm

    from foundation.checkpoint import CheckpointError
    from foundation.config import ConfigError
    from foundation.engine.failure import one_line

    try:
        # building the model from its file may print (a pretrained file it no longer needs,
        # library deprecation notes): keep stdout for the records
        with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            predictor = load_predictor(a.model, a.task, a.device)
        records = predictor.run(a.inputs, batch_size=a.batch_size, progress=True, **options)
        failed = 0
        with warnings.catch_warnings():
            # a library's warning: one line (not its source line too), above the progress bar
            warnings.showwarning = lambda message, *_, **__: tqdm.write(
                f"foundation predict: warning: {one_line(message)}", file=sys.stderr)
            for record in records:
                name = " ".join(record["input"]) if isinstance(record["input"], list) else record["input"]
                if "warning" in record:  # the input was used, with a caveat (a truncated audio file)
                    tqdm.write(f"foundation predict: warning: {name}: {record['warning']}", file=sys.stderr)
                if "error" in record:
                    failed += 1
                    tqdm.write(f"foundation predict: error: {record['error']}", file=sys.stderr)
                elif a.json:
                    tqdm.write(json.dumps(record), file=sys.stdout)  # (tqdm.write: lines above the progress bar)
                else:
                    tqdm.write(f"{name}: {predictor.describe(record)}", file=sys.stdout)
    except (InputError, NoPredictor, ConfigError, CheckpointError, FileNotFoundError) as e:
        print(f"foundation predict: error: {e}", file=sys.stderr)
        return 2
    return 1 if failed else 0
