"""Time our preln / magneto backbones against timm and torchscale; see ``studies.bench``.

    python benchmarks/bench_backbone.py [--dim 384 --depth 6 --heads 6 --tokens 197 --batch 8 ...]

Same as ``foundation bench backbone [flags]``.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from studies.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
