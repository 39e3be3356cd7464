"""The summary of one ``benchmarks/gpu_check.sh`` run: ``python benchmarks/gpu_report.py OUT``.

Reads what the steps left in OUT (steps.tsv, the logs, the benchmarks' JSON) and prints one
markdown page: the steps, the GPU tests, the backbone table (eager and compiled, both sizes),
the RNN-T joint and the paper-size runs. A step that failed or never ran shows as such.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

SIZES = {"vitb": "ViT-B (D 768, 12 layers, 197 tokens)", "speech": "speech (D 512, 18 layers, 500 frames)"}


def load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def steps(out: Path) -> list[str]:
    lines = ["| step | exit | seconds |", "|---|---:|---:|"]
    for row in (out / "steps.tsv").read_text().splitlines() if (out / "steps.tsv").exists() else []:
        name, rc, secs = row.split("\t")
        shown = {"0": "ok", "124": "over its limit", "skipped": "skipped (budget spent)"}.get(rc, f"FAILED ({rc})")
        lines.append(f"| {name} | {shown} | {secs} |")
    return lines


def log_tail(out: Path, name: str, n: int = 1) -> list[str]:
    path = out / f"{name}.log"
    return path.read_text(errors="replace").strip().splitlines()[-n:] if path.exists() else ["(no log)"]


def gpu_tests(out: Path) -> list[str]:
    lines = [f"pytest: {log_tail(out, 'gpu_tests')[0]}"]
    log = (out / "gpu_tests.log").read_text(errors="replace") if (out / "gpu_tests.log").exists() else ""
    lines += [f"- {m}" for m in re.findall(r"^(?:FAILED|SKIPPED|ERROR) .*$", log, flags=re.M)]
    notes = out / "gpu_tests.jsonl"
    if notes.exists():
        lines += ["", "Measured by the tests:"]
        for row in notes.read_text().splitlines():
            (key, value), = json.loads(row).items()
            lines.append(f"- {key}: {value}")
    return lines


def backbone(out: Path) -> list[str]:
    lines = []
    for size, title in SIZES.items():
        runs = {mode: load(out / f"{size}_{mode}.json") for mode in ("eager", "compiled")}
        got = {mode: {r["name"]: r for r in run["results"]} for mode, run in runs.items() if run}
        if not got:
            lines += [f"### {title}: no results", ""]
            continue
        any_run = next(run for run in runs.values() if run)
        cfg = any_run["config"]
        lines += [f"### {title}, batch {cfg['batch']}, {cfg['dtype']}, {any_run.get('device_name') or cfg['device']}"
                  f" ({any_run['step_tflop']:.2f} TFLOP a training step)", "",
                  "| model | eager ms/step | eager MFU | eager peak GiB | compiled ms/step | compiled MFU "
                  "| compiled peak GiB |", "|---|---:|---:|---:|---:|---:|---:|"]
        names = list(dict.fromkeys(n for mode in got.values() for n in mode))
        for name in names:
            cells = [name]
            for mode in ("eager", "compiled"):
                r = got.get(mode, {}).get(name)
                if r is None:
                    cells += ["-", "-", "-"]
                    continue
                cells += [f"{r['median_ms']:.1f}", "-" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%",
                          "-" if r.get("peak_bytes") is None else f"{r['peak_bytes'] / 2**30:.2f}"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        for mode, run in runs.items():
            if run:
                ratios = run["ratios"]
                lines.append(f"{mode}: " + "; ".join(f"{o} / {r} = {v:.3f}" for o, refs in ratios.items()
                                                      for r, v in refs.items()))
                lines += [f"  {t}" for t in run.get("targets", [])]
        lines.append("")
    return lines


def rnnt(out: Path) -> list[str]:
    run = load(out / "rnnt_joint.json")
    if not run:
        return ["no results: " + log_tail(out, "rnnt_joint")[0]]
    a = run["args"]
    lines = [f"B {a['batch']}, T {a['frames']}, U {a['units']}, V {a['vocab']}, joint {a['joint_dim']} on {a['device']}",
             "", "| variant | peak GiB | saved for backward GiB | seconds (fwd+bwd) | loss - first |",
             "|---|---:|---:|---:|---:|"]
    ok = [r for r in run["rows"] if "error" not in r]
    for r in run["rows"]:
        if "error" in r:
            lines.append(f"| {r['variant']} | failed: {r['error']} | | | |")
            continue
        full = ok[0]["loss"]
        lines.append(f"| {r['variant']} | {r['peak_bytes'] / 2**30:.2f} | {r['saved_bytes'] / 2**30:.2f} | "
                     f"{r['seconds']:.2f} | {r['loss'] - full:+.1e} |")
    return lines


def paper_sizes(out: Path) -> list[str]:
    table = out / "paper_sizes" / "paper_sizes.md"
    if table.exists():
        return table.read_text().strip().splitlines()
    return ["no results: " + log_tail(out, "paper_sizes")[0]]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python benchmarks/gpu_report.py OUT", file=sys.stderr)
        return 2
    out = Path(argv[0])
    page = ["# GPU check", ""] + log_tail(out, "environment", 20) + [""] + steps(out)
    page += ["", "## GPU tests", ""] + gpu_tests(out)
    page += ["", "## Backbone: one training step (forward + backward)", ""] + backbone(out)
    profile = out / "profile" / "profile.md"
    page += ["## Where the Magneto step's time goes", ""]
    page += profile.read_text().strip().splitlines() if profile.exists() else ["no results: " + log_tail(out, "profile")[0]]
    page += ["", "## RNN-T joint + loss: whole lattice vs sub-batches", ""] + rnnt(out)
    page += ["", "## Paper-size configs: a short run each on generated data", ""] + paper_sizes(out)
    print("\n".join(page))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
