"""The ``foundation`` command. Each subcommand lives in its own module with its own
argparse ``main(argv)``; this file only dispatches, importing lazily so that
``foundation --help`` stays fast. The research tools are in the ``studies`` package, named
here by string only: foundation never imports studies."""
from __future__ import annotations

import importlib
import sys

# (words, module, description)
COMMANDS = [
    (("demo",), "studies.demo:main",
     "make the demo data and compare Pre-LN with Magneto on every modality, ~15 min on 2 CPU cores"),
    (("train",), "foundation.engine.cli:train_main", "train from a YAML config: foundation train CONFIG [key=value ...]"),
    (("eval",), "foundation.engine.cli:eval_main", "evaluate a checkpoint: foundation eval CONFIG checkpoint=PATH"),
    (("plot",), "studies.plots:main", "draw a run's loss/metric curves: foundation plot RUN_DIR"),
    (("predict",), "foundation.engine.predict:predict_main",
     "run a trained model on your files: foundation predict RUN_DIR INPUT... [--json] [--out DIR]"),
    (("compare",), "studies.compare:main",
     "one recipe under several norms x seeds x lrs, one report: foundation compare CONFIG"),
    (("compare", "depth"), "studies.depth:main",
     "DeepNet's convergence with varying depth in miniature: foundation compare depth [--thousand]"),
    (("compare", "stability"), "studies.stability:main",
     "learning-rate ladders of deep narrow models per modality and rule: foundation compare stability [--quick]"),
    (("compare", "pretraining"), "studies.pretraining:main",
     "cross-modal against single-modality pretraining per task: foundation compare pretraining [--seeds N]"),
    (("compare", "labels"), "studies.labels:main",
     "fine-tuning at label budgets from scratch and from each modality's pretraining: "
     "foundation compare labels [--quick] [--tasks ..]"),
    (("compare", "guard"), "studies.guard_eval:main",
     "the stability guard's lead time and false alarms, replayed on a stability study's runs: "
     "foundation compare guard OUT [--search]"),
    (("data", "make"), "foundation.cli:data_make_main", "generate a demo data set in its real layout: foundation data make {vision,segmentation,speech,vl} --out DIR"),
    (("probe", "update"), "studies.probe:main", "DeepNet model-update measurement per norm and depth"),
    (("export", "timm"), "foundation_tasks.classification.export:main",
     "a classification run as a timm model file: foundation export timm RUN_DIR --out model.safetensors"),
    (("bench", "backbone"), "studies.bench:main", "time our backbone against timm and torchscale"),
]


def data_make_main(argv: list[str]) -> int:
    from foundation.config import ConfigError
    from foundation.engine.demo_cli import demo_data_sets

    sets = demo_data_sets()  # declared by the generators themselves (DEMO_DATA in a task's demo.py)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: foundation data make {" + ",".join(sets) + "} --out DIR [--seed N] [...]")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in sets:
        print(f"foundation data make: unknown data set {name!r}; known: {', '.join(sets)}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(sets[name].module)
    except ConfigError as e:  # the generator's task needs an install extra
        print(f"foundation data make {name}: {e}", file=sys.stderr)
        return 2
    return module.main(rest) or 0


def usage() -> str:
    lines = ["usage: foundation COMMAND [args]", "", "commands:"]
    width = max(len(" ".join(words)) for words, _, _ in COMMANDS)
    for words, _, doc in COMMANDS:
        lines.append(f"  {' '.join(words):<{width}} {doc}")
    lines.append("\n`foundation COMMAND --help` describes each command.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from foundation.engine.host_memory import keep_freed_memory
    keep_freed_memory()  # every command's process, and the runs a study or the demo launches
    for words, target, _ in sorted(COMMANDS, key=lambda c: -len(c[0])):  # `compare depth` before `compare`
        if tuple(argv[: len(words)]) == words:
            module, func = target.split(":")
            return getattr(importlib.import_module(module), func)(argv[len(words):]) or 0
    print(usage(), file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
    if argv and argv[0] not in ("-h", "--help"):
        print(f"\nfoundation: unknown command {' '.join(argv[:2])!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
