"""Does MIM pretraining help? Fine-tune Magneto and Pre-LN from MIM and from scratch,
same budget, several seeds, and print the table (the README's vision table).

    foundation data make vision --out data/vision-demo
    python -m studies.mim --seeds 0 1 --jobs 2

Runs the chain with ``foundation train`` (as a user would): the tokenizer
(``configs/vision/tiny_tokenizer.yaml``), one MIM pretraining per norm
(``tiny_mim.yaml``), then ``tiny_finetune.yaml`` per seed with
``init_from`` the MIM run, and with ``init_from=null`` (scratch): the same steps,
schedule, augmentation and seed. Finished runs are reused, so an interrupted comparison
continues where it stopped. The score is the top-1 of the final evaluation (not the
best of several), on the val split.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from studies.runs import ensure, last_eval, read_records, status

NORMS = ("magneto", "preln")
CONFIGS = Path("configs/vision")


def run_dir(out: Path, name: str) -> Path:
    return out / name


def final_eval(path: Path, key: str) -> float | None:
    """The last evaluation's ``key`` in a run's metrics.jsonl, if the run finished (its status.json)."""
    if status(path) != "finished":
        return None
    return last_eval(read_records(path))[1].get(key)


def train(config: Path, name: str, out: Path, overrides: list[str], key: str, threads: int) -> float:
    """``foundation train config`` as run ``name`` (studies.runs.ensure: skipped when it finished,
    resumed when it began); its final ``key``."""
    path = run_dir(out, name)
    start = time.perf_counter()
    os.environ["OMP_NUM_THREADS"] = str(threads)  # read by each run's own process
    failure = ensure(config, [f"run_name={name}", f"output_dir={out}", "log.progress=false", *overrides], path,
                     head=f"[{name}]")
    value = final_eval(path, key)
    if failure or value is None:
        raise RuntimeError(f"[{name}] did not finish ({failure or status(path)}); see {path}/train.log")
    print(f"[{name}] {key} {value:.4f} ({time.perf_counter() - start:.0f} s)", flush=True)
    return value


def table(results: dict[tuple[str, str], list[float]], seeds: list[int], steps: str) -> str:
    lines = [f"| backbone | init | top-1 (mean over {len(seeds)} seeds) | per seed ({', '.join(map(str, seeds))}) |",
             "|---|---|---|---|"]
    for norm in NORMS:
        for init in ("scratch", "MIM"):
            v = results[(norm, init)]
            lines.append(f"| {'Magneto' if norm == 'magneto' else 'Pre-LN (ViT)'} | {init} | "
                         f"{100 * statistics.mean(v):.1f} | {' / '.join(f'{100 * x:.1f}' for x in v)} |")
    return "\n".join(lines) + f"\n\n(fine-tuning: {steps})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.mim", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (each with one thread)")
    p.add_argument("--out", type=Path, default=Path("checkpoints"), help="output_dir of every run")
    p.add_argument("--data", default="data/vision-demo", help="the ImageNet-layout folder")
    p.add_argument("--finetune", nargs="*", default=[], metavar="key=value", help="overrides for the fine-tuning runs")
    p.add_argument("--mim", nargs="*", default=[], metavar="key=value", help="overrides for the MIM runs")
    a = p.parse_args(argv)
    data = [f"tasks.0.data_dir={a.data}"]
    tok = run_dir(a.out, "vision-tokenizer-tiny") / "best" / "model.safetensors"
    train(CONFIGS / "tiny_tokenizer.yaml", "vision-tokenizer-tiny", a.out, data, "vq_tokenizer/rec_loss", a.jobs)
    with ThreadPoolExecutor(a.jobs) as pool:
        mim = {norm: pool.submit(train, CONFIGS / "tiny_mim.yaml", f"vision-mim-tiny-{norm}", a.out,
                                 data + [f"backbone.norm={norm}", f"tasks.0.tokenizer={tok}", *a.mim], "mim/mim_acc", 1) for norm in NORMS}
        for f in mim.values():
            f.result()
        jobs = {}
        for seed in a.seeds:
            for norm in NORMS:
                pre = run_dir(a.out, f"vision-mim-tiny-{norm}") / "best" / "model.safetensors"
                for init, init_from in (("scratch", "null"), ("MIM", str(pre))):
                    name = f"vision-ft-tiny-{norm}-{init.lower()}-s{seed}"
                    jobs[(norm, init, seed)] = pool.submit(
                        train, CONFIGS / "tiny_finetune.yaml", name, a.out,
                        data + [f"backbone.norm={norm}", f"seed={seed}", f"init_from={init_from}", *a.finetune], "classification/top1", 1)
        results = {(n, i): [jobs[(n, i, s)].result() for s in a.seeds] for n in NORMS for i in ("scratch", "MIM")}
    print()
    print(table(results, a.seeds, "configs/vision/tiny_finetune.yaml backbone.norm={magneto,preln} " + " ".join(a.finetune)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
