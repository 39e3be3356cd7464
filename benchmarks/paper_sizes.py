"""One short run of each paper-size config through the real engine, on generated inputs: throughput,
peak GPU memory and whether the loss moves, per config, in one table.

    PYTHONPATH=. python benchmarks/paper_sizes.py --out runs/paper_sizes               # GPU: 30 steps each
    PYTHONPATH=. python benchmarks/paper_sizes.py --only vit_mim upernet --batch upernet=4 --steps 50
    OMP_NUM_THREADS=1 python benchmarks/paper_sizes.py --tiny --device cpu             # CPU smoke test

Configs (``--only``): vit_mim (configs/vision/base_mim.yaml, 224 px), vit_finetune (base_finetune.yaml,
from scratch), upernet (configs/segmentation/ade20k_base.yaml at a 512 crop), asr_18l
(configs/asr/librispeech_18l.yaml), vl_pretrain (configs/vl/pretrain.yaml, text + image + pair each step).

Each config gets a small data set in its task's real layout, at the config's resolution and sizes,
under OUT/data (kept and reused on a rerun with the same sizes), then ``foundation train CONFIG
key=value ...`` as a subprocess (``python -m foundation.cli``, PYTHONPATH = this checkout), with
train.steps=N, the batch size, eval.every=0 / save.every=0 (the engine still evaluates one batch
and saves once at the end: both are in the wall time, not in samples/s), log.every=1 and the
schedule's warmup shortened to N/3 steps (else 30 steps of a 6k-step warmup never leave lr ~ 0 and
"loss fell" says nothing; the compute is the same). The data generators need no network:

* vit_mim's VQ-KD tokenizer is made by the project itself: configs/vision/base_tokenizer.yaml with the
  pixel teacher (the CLIP teacher needs downloaded weights) trained for 1 step, which initialises its
  codebook (k-means) and saves it as any tokenizer run does. MIM only encodes with it: the same cost
  as BEiT v2's released tokenizer.
* vit_finetune: ImageNet layout with 10 classes, so num_classes=10 (the task checks the folders).
* asr_18l: no eSpeak NG on the GPU machine, so utterances are tone sequences (one tone per word, a
  pitch per word, plus noise) of a fixed length in the LibriSpeech layout, with transcripts of made-up
  words; the sentencepiece model (vocab_size units) is written to the task's prep folder beforehand
  from those transcripts plus more sentences of the same words (a few dozen transcripts cannot
  hold 5000 units). All utterances are equally long, so max_frames makes every length bucket
  exactly --batch utterances; samples/s is utterances/s (the engine counts buckets).
* vl_pretrain: the VL demo's scenes and captions at 224 px; text lines joined to ~130 words (BEiT-3's
  text items fill max_text_len=128).

train.num_workers stays the config's (0 unless it says: data loading in the training process) unless
--workers N: on an H200, ViT-B at batch 64 ran 185 images/s with 0 workers and ~500-550 with 8.

Per config: median samples/s over the steps after the first 5 (all but the first when shorter),
the mean loss of the first 3 steps against the last 3 (1 and 1 below 6 steps), peak GPU memory
(``mem_gib`` of the engine's step records, CUDA only), wall time of the run(s) and status.json's
status. A failure, a timeout (--timeout per config) or a missing extra is a row, not a crash;
--deadline skips the configs left. Writes OUT/paper_sizes.md and OUT/paper_sizes.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

NAMES = ("vit_mim", "vit_finetune", "upernet", "asr_18l", "vl_pretrain")
CONFIGS = {"vit_mim": "configs/vision/base_mim.yaml", "vit_finetune": "configs/vision/base_finetune.yaml",
           "upernet": "configs/segmentation/ade20k_base.yaml", "asr_18l": "configs/asr/librispeech_18l.yaml",
           "vl_pretrain": "configs/vl/pretrain.yaml"}
# per process, what an H200 (and an 80 GB H100) holds in bf16; the configs' own are per GPU of 8
DEFAULT_BATCH = {"vit_mim": 64, "vit_finetune": 64, "upernet": 8, "asr_18l": 16, "vl_pretrain": 32}
UNITS = {"vit_mim": "images", "vit_finetune": "images", "upernet": "crops", "asr_18l": "utterances",
         "vl_pretrain": "items (text+image+pair)"}
TINY_BACKBONE = ["backbone.dim=32", "backbone.depth=2", "backbone.heads=2", "backbone.ffn_dim=64"]
WARMUP_STEPS = 5  # records skipped before the median samples/s
EXTRA_HINT = "pip install 'foundation-suite["  # in the one line of a task whose extra is missing


class Skip(Exception):
    """A config that cannot run here: its row says why."""


# --------------------------------------------------------------------------- data, in the tasks' layouts


def cached(folder: Path, params: dict, write) -> Path:
    """``write(folder)`` unless a previous call with the same ``params`` finished there."""
    stamp = folder / "paper_sizes_params.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == params:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    write(folder)
    stamp.write_text(json.dumps(params))
    return folder


def image_folder(out: Path, n_train: int, size: int) -> Path:
    from foundation_tasks.classification import demo

    params = {"n": n_train, "size": size}
    return cached(out / "imagenet", params, lambda d: demo.write_dataset(
        d, seed=0, size=size, train_per_class=math.ceil(n_train / 10), val_per_class=1, num_classes=10))


def ade_folder(out: Path, n_train: int, height: int, width: int) -> Path:
    from foundation_tasks.segmentation import demo  # needs the segmentation extra: a row says so

    params = {"n": n_train, "h": height, "w": width}
    return cached(out / "ade", params, lambda d: demo.write(d, 0, n_train, 1, height, width))


def vl_folder(out: Path, n_images: int, size: int, text_lines: int) -> Path:
    from foundation_tasks.vl_common.demo import write_dataset

    def write(d: Path) -> None:
        write_dataset(d, image_size=size, vqa_train=n_images, vqa_val=4, questions_per_image=1, nlvr2_train=1,
                      nlvr2_dev=1, text_lines=text_lines * 20)
        for name in ("train", "val"):  # ~130 words a line: BEiT-3's text items fill max_text_len
            path = d / "text" / f"{name}.txt"
            words = path.read_text().split()
            path.write_text("\n".join(" ".join(words[i:i + 130]) for i in range(0, len(words), 130)) + "\n")

    return cached(out / "vl", {"n": n_images, "size": size, "lines": text_lines}, write)


SAMPLE_RATE = 16000
SYLLABLES = [a + b for a in "BCDFGHKLMNPRSTVWZ" for b in "AEIOU"] + ["TH", "SH", "CH", "ST", "ER", "ING"]


def speech_folder(out: Path, n_train: int, seconds: float, vocab_size: int) -> Path:
    """LibriSpeech layout: {train,dev}/<speaker>/1/<speaker>-1-<utt>.flac + <speaker>-1.trans.txt, and the
    sentencepiece model at the task's default prep path (<data_dir>/prep/train/unigram<V>.model)."""
    from foundation_tasks.asr.tokenizer import train_tokenizer  # first: its package names a missing extra
    import soundfile as sf

    def write(d: Path) -> None:
        rng = np.random.default_rng(0)
        lexicon = sorted({"".join(rng.choice(SYLLABLES, rng.integers(1, 4))) for _ in range(12000)})
        n = int(seconds * SAMPLE_RATE)
        words_per_utt = max(2, round(seconds * 2.2))  # LibriSpeech reads ~2.2 words a second
        texts = []
        for split, count in (("train", n_train), ("dev", 2)):
            lines: dict[Path, list[str]] = {}
            for i in range(count):
                words = list(rng.choice(lexicon, words_per_utt))
                per = n // len(words)  # a tone per word, its pitch from the word: something to learn
                pitch = np.repeat([110.0 + 35 * (zlib.crc32(w.encode()) % 24) for w in words], per)
                pitch = np.pad(pitch, (0, n - len(pitch)), mode="edge")
                phase = 2 * np.pi * np.cumsum(pitch) / SAMPLE_RATE
                swell = 0.5 - 0.5 * np.cos(2 * np.pi * (np.arange(n) % per) / per)
                wav = (0.3 * np.sin(phase) + 0.1 * np.sin(2 * phase)) * swell + 0.01 * rng.standard_normal(n)
                speaker = 100 + i % 4
                folder = d / split / str(speaker) / "1"
                folder.mkdir(parents=True, exist_ok=True)
                utt = f"{speaker}-1-{i:04d}"
                sf.write(folder / f"{utt}.flac", wav.astype(np.float32), SAMPLE_RATE, subtype="PCM_16")
                lines.setdefault(folder, []).append(f"{utt} {' '.join(words)}")
                texts += [" ".join(words)] if split == "train" else []
            for folder, text in lines.items():
                (folder / f"{folder.parent.name}-1.trans.txt").write_text("\n".join(text) + "\n")
        more = [" ".join(rng.choice(lexicon, 30)) for _ in range(6000)]  # enough pieces for vocab_size units
        train_tokenizer(texts + more, d / "prep" / "train" / f"unigram{vocab_size}.model", vocab_size)

    return cached(out / "speech", {"n": n_train, "seconds": seconds, "vocab": vocab_size}, write)


def speech_frames(seconds: float) -> int:
    """Filterbank frames of an utterance (Kaldi's 25 ms windows every 10 ms, snip_edges)."""
    return 1 + (int(seconds * SAMPLE_RATE) - 400) // 160


# --------------------------------------------------------------------------- each config's overrides


def plan(name: str, data: Path, batch: int, tiny: bool, run) -> list[str]:
    """The overrides of ``name``'s run on generated data (making the data first). ``run(config,
    overrides, label)`` trains a preliminary run (vit_mim's tokenizer) and returns its run dir."""
    n = max(32, 2 * batch)  # the engine refuses a training set smaller than one batch
    small = TINY_BACKBONE if tiny else []
    if name in ("vit_mim", "vit_finetune"):
        size, patch = (32, 8) if tiny else (224, 16)
        root = image_folder(data, n, size + size // 7)  # ImageNet's are larger than the crop
        if name == "vit_finetune":
            return small + ["init_from=null"] + [f"tasks.classification.{k}" for k in (
                f"data_dir={root}", "num_classes=10", f"img_size={size}", f"patch_size={patch}")]
        tok = [f"tasks.vq_tokenizer.{k}" for k in (f"data_dir={root}", f"img_size={size}", f"patch_size={patch}",
                                                   "teacher=pixels", "rec_loss=mse", "clip_pretrained=null")]
        tok += TINY_BACKBONE + ["tasks.vq_tokenizer.num_codes=64", "tasks.vq_tokenizer.decoder_depth=1"] if tiny else []
        # one step: the k-means start of its codebook, which loading a tokenizer insists on
        tok += ["train.steps=1", "schedule.warmup_steps=0", "train.batch_size=8", "eval.batch_size=8"]
        tok_dir = run("configs/vision/base_tokenizer.yaml", tok, "tokenizer")
        mask = ["num_masking_patches=6", "min_num_patches=2"] if tiny else []
        return small + [f"tasks.mim.{k}" for k in [f"data_dir={root}", f"tokenizer={tok_dir}/best/model.safetensors",
                                                   f"img_size={size}", f"patch_size={patch}", *mask]]
    if name == "upernet":
        crop, patch = (64, 8) if tiny else (512, 16)
        root = ade_folder(data, n, crop, crop * 4 // 3)  # ADE20k: landscape, short side ~512
        seg = [f"data_root={root}", f"img_size={crop}", f"patch_size={patch}", f"test_stride={crop * 2 // 3}"]
        seg += ["out_indices=[0,1,2,3]", "channels=16", "aux_channels=8"] if tiny else []
        grid = [f"backbone.rel_pos_grid=[{crop // patch},{crop // patch}]"]
        return (TINY_BACKBONE + ["backbone.depth=4"] if tiny else []) + grid + [f"tasks.segmentation.{k}" for k in seg]
    if name == "asr_18l":
        if batch < 2:
            raise Skip("asr_18l needs --batch >= 2 (equal-length buckets of 1 are not possible with ESPnet's rule)")
        seconds, vocab = (2.0, 64) if tiny else (15.0, 5000)  # LibriSpeech: up to ~35 s, 12.3 s on average
        root = speech_folder(data, 4 * batch, seconds, vocab)
        # ESPnet closes a bucket with the utterance that takes it past max_frames: B equal ones per bucket
        frames = speech_frames(seconds) * (batch - 1) + 1
        asr = [f"data_dir={root}", "train_splits=[train]", "eval_splits=[dev]", f"vocab_size={vocab}",
               f"max_frames={frames}", "decoding=greedy"]  # the final evaluation: greedy, not an 8-beam search
        asr += ["vgg_channels=[4,8]", "predictor_embed_dim=16", "predictor_dim=32", "predictor_layers=1",
                "joint_dim=32", "aux_layers=[0]", "aux_mlp_dim=16"] if tiny else []
        return small + [f"tasks.asr.{k}" for k in asr]
    if name == "vl_pretrain":
        size, patch = (32, 8) if tiny else (224, 16)
        root = vl_folder(data, n, size, n)
        images, captions = root / "vqa", root / "coco" / "annotations"
        paths = {"text": [f"train_data={root}/text/train.txt", f"eval_data={root}/text/val.txt"],
                 "image": [f"train_data={images}/train2014", f"eval_data={images}/val2014"],
                 "pair": [f"train_data={captions}/captions_train2014.json", f"train_images={images}/train2014",
                          f"eval_data={captions}/captions_val2014.json", f"eval_images={images}/val2014"]}
        out = list(small)
        for tid, p in paths.items():
            sizes = [f"img_size={size}", f"patch_size={patch}"] + (["visual_vocab_size=256", "max_text_len=32"]
                                                                   if tiny and tid != "text" else [])
            out += [f"tasks.{tid}.{k}" for k in p + sizes + [f"batch_size={batch}", "max_eval_items=8"]]
        return out
    raise ValueError(name)


# --------------------------------------------------------------------------- running and reading


def train(config: str, overrides: list[str], log: Path, timeout: float) -> dict:
    """``foundation train`` in its own process group (killed whole on timeout: DataLoader workers too)."""
    cmd = [sys.executable, "-m", "foundation.cli", "train", str(ROOT / config), *overrides]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    print("  $ " + shlex.join(cmd[1:]), flush=True)
    start = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    lines = [l for l in log.read_text(errors="replace").splitlines() if l.strip()]
    error = next((l for l in reversed(lines) if "error:" in l), lines[-1] if lines else "")
    return {"rc": rc, "wall_s": time.perf_counter() - start, "error": error.strip(), "command": shlex.join(cmd)}


def read_run(run_dir: Path) -> dict:
    """Throughput, loss and memory of a run's step records; status.json's status."""
    out: dict = {"status": None, "steps": 0, "samples_per_s": None, "loss_first": None, "loss_last": None,
                 "loss_fell": None, "mem_gib": None}
    status = run_dir / "status.json"
    if status.is_file():
        info = json.loads(status.read_text())
        out["status"], out["message"] = info.get("status"), info.get("message", "")
    path = run_dir / "metrics.jsonl"
    records = [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.is_file() else []
    steps = [r for r in records if "samples_per_s" in r and "event" not in r]
    if not steps:
        return out
    out["steps"] = steps[-1]["step"]
    warm = steps[WARMUP_STEPS:] or steps[1:] or steps
    # asr: the engine counts length buckets; its records count the utterances
    rate = [r["asr/utts"] / r["step_time"] if "asr/utts" in r else r["samples_per_s"] for r in warm]
    out["samples_per_s"] = statistics.median(rate)
    if "asr/utts" in steps[-1]:
        out["note"] = f"{statistics.mean(r['asr/utts'] for r in steps):g} utterances a bucket"
    losses = [r["loss"] for r in steps if isinstance(r.get("loss"), (int, float)) and math.isfinite(r["loss"])]
    if losses:
        k = min(3, max(1, len(losses) // 2))
        out["loss_first"], out["loss_last"] = sum(losses[:k]) / k, sum(losses[-k:]) / k
        out["loss_fell"] = out["loss_last"] < out["loss_first"]
    mems = [r["mem_gib"] for r in steps if "mem_gib" in r]
    out["mem_gib"] = max(mems) if mems else None
    return out


def bench(name: str, args, out: Path, end: float) -> dict:
    batch = args.batch.get(name, 2 if args.tiny else DEFAULT_BATCH[name])
    row = {"name": name, "config": CONFIGS[name], "batch": batch, "unit": UNITS[name], "status": None, "note": ""}
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    wall = 0.0
    common = [f"output_dir={runs}", f"train.steps={args.steps}", f"train.batch_size={batch}",
              f"schedule.warmup_steps={max(1, args.steps // 3)}", "eval.every=0", "eval.max_batches=1",
              f"eval.batch_size={min(batch, 4)}", "save.every=0", "save.keep=1", "log.every=1",
              "log.progress=false", "log.writers=[jsonl]", "overwrite=true", f"device={args.device}"]
    if args.workers is not None or args.tiny:
        common.append(f"train.num_workers={args.workers if args.workers is not None else 0}")

    def run(config: str, overrides: list[str], label: str) -> Path:
        nonlocal wall
        left = end - time.time()
        if left < 1:
            raise Skip(f"timeout: {args.timeout:g} s spent before {label}")
        result = train(config, common + overrides + [f"run_name={name}-{label}"], runs / f"{name}-{label}.log", left)
        wall += result["wall_s"]
        if result["rc"] != 0:
            raise Skip(f"{label} run: " + ("timeout" if result["rc"] is None else result["error"]))
        return runs / f"{name}-{label}"

    start = time.perf_counter()
    try:
        overrides = plan(name, out / "data", batch, args.tiny, run)
        row["prep_s"] = round(time.perf_counter() - start - wall, 1)
        run_dir = runs / name
        limit = min(args.timeout, end - time.time())
        result = train(CONFIGS[name], common + [f"run_name={name}"] + overrides, runs / f"{name}.log", limit)
    except Exception as e:  # noqa: BLE001 - a missing extra, bad data, a failed preliminary run: one row
        message = " ".join(str(e).split())
        row.update(status="missing extra" if EXTRA_HINT in message else "not run", note=message[:300],
                   wall_s=round(wall, 1))
        return row
    wall += result["wall_s"]
    row.update(read_run(run_dir), wall_s=round(wall, 1), command=result["command"], run_dir=str(run_dir))
    notes = [row.pop("note", None)]
    if result["rc"] is None:
        row["status"] = "timeout"
        cause = "its --timeout" if limit >= args.timeout else "the --deadline"
        notes.append(f"killed after {limit:.0f} s ({cause}); the numbers are of the steps it logged")
    elif row["status"] in (None, "finished") and result["rc"] != 0:  # e.g. refused at start: no status.json
        row["status"] = "missing extra" if EXTRA_HINT in result["error"] else row["status"] or "failed"
        notes.append(result["error"])
    elif row["status"] != "finished":
        notes.append(row.get("message", ""))
    row["note"] = "; ".join(n[:300] for n in notes if n)
    if not args.keep_checkpoints:  # ~1 GB a ViT-B run; the metrics are what this is for
        for sub in ("ckpt", "best"):
            shutil.rmtree(run_dir / sub, ignore_errors=True)
    return row


def fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def table(rows: list[dict]) -> str:
    lines = ["| config | status | steps | batch | samples/s | loss first -> last | fell | peak GiB | wall s | note |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        loss = "-" if r.get("loss_first") is None else f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}"
        fell = {True: "yes", False: "no", None: "-"}[r.get("loss_fell")]
        lines.append(f"| {r['name']} | {r['status']} | {r.get('steps', '-')} | {r['batch']} | "
                     f"{fmt(r.get('samples_per_s'))} | {loss} | {fell} | {fmt(r.get('mem_gib'), '.2f')} | "
                     f"{fmt(r.get('wall_s'))} | {r.get('note', '')} |")
    return "\n".join(lines)


def parse_batch(items: list[str]) -> dict[str, int]:
    """``--batch 16`` (every config) or ``--batch upernet=4 vl_pretrain=16``."""
    out: dict[str, int] = {}
    for item in items:
        name, _, value = item.rpartition("=")
        if name and name not in NAMES:
            raise SystemExit(f"paper_sizes: --batch {item}: unknown config {name!r} (one of {', '.join(NAMES)})")
        if not value.isdigit() or int(value) < 1:
            raise SystemExit(f"paper_sizes: --batch {item}: expected N or NAME=N with N >= 1")
        out.update({name: int(value)} if name else dict.fromkeys(NAMES, int(value)))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=NAMES, default=list(NAMES), metavar="NAME",
                   help=f"configs to run: {', '.join(NAMES)} (default all)")
    p.add_argument("--tiny", action="store_true", help="shrunk models and inputs, batch 2, 3 steps: a CPU smoke test")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--steps", type=int, help="training steps per config (default 30; --tiny: 3)")
    p.add_argument("--batch", nargs="+", default=[], metavar="N|NAME=N",
                   help="per-process batch size (asr_18l: utterances a bucket); default "
                        + ", ".join(f"{k} {v}" for k, v in DEFAULT_BATCH.items()) + "; --tiny: 2")
    p.add_argument("--workers", type=int, help="train.num_workers (default: the config's; --tiny: 0)")
    p.add_argument("--timeout", type=float, default=150.0, help="seconds per config, its preliminary runs included")
    p.add_argument("--deadline", type=float, help="seconds for the whole script; the configs not started by then "
                                                  "are skipped")
    p.add_argument("--out", type=Path, default=Path("runs/paper_sizes"),
                   help="data, runs and results (default %(default)s)")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep the runs' ckpt/ and best/ folders")
    args = p.parse_args(argv)
    args.steps = args.steps or (3 if args.tiny else 30)
    args.batch = parse_batch(args.batch)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    rows = []
    for i, name in enumerate(args.only, 1):
        if args.deadline is not None and time.time() - start >= args.deadline:
            rows.append({"name": name, "config": CONFIGS[name], "batch": args.batch.get(name, "-"),
                         "status": "not run: deadline", "note": f"--deadline {args.deadline:g} s reached"})
            continue
        end = time.time() + args.timeout
        if args.deadline is not None:
            end = min(end, start + args.deadline)
        print(f"[{i}/{len(args.only)}] {name} ({CONFIGS[name]})", flush=True)
        rows.append(bench(name, args, out, end))
        r = rows[-1]
        print(f"  {r['status']}: {fmt(r.get('samples_per_s'))} {r['unit']}/s, {r.get('wall_s', 0):.1f} s"
              + (f" ({r['note']})" if r["note"] else ""), flush=True)
    text = table(rows)
    mode = "tiny" if args.tiny else "paper sizes"
    header = (f"{mode}, device={args.device}, {args.steps} steps; samples/s: median after the first "
              f"{WARMUP_STEPS} steps; total {time.time() - start:.0f} s\n\n")
    (out / "paper_sizes.md").write_text(header + text + "\n")
    (out / "paper_sizes.json").write_text(json.dumps({"mode": mode, "device": args.device, "steps": args.steps,
                                                      "seconds": round(time.time() - start, 1), "rows": rows},
                                                     indent=2) + "\n")
    print("\n" + header + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
