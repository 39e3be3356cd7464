"""``foundation export timm RUN_OR_FILE --out model.safetensors``: a classification run as a
file that timm's registry loads (an existing ``--out`` is replaced only with ``--force``, and
the exported file itself never):

    timm.create_model("magneto_tiny_patch16_224", pretrained=True,
                      pretrained_cfg_overlay=dict(file="model.safetensors"))

The file is a ``foundation.vit.VisionTransformer`` checkpoint (timm's tensor names under our
backbone, the config in the metadata), so the model timm builds is the run's architecture
and computes the run's logits; timm keywords (``num_classes=...`` for a new head,
``img_size=...`` with the position embedding resampled, ``drop_path_rate=...``) still apply.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def timm_name(cfg) -> str:
    """The registered name for a ViT config: its norm rule and, where it is one, its size."""
    from foundation.vit import _SIZES

    bb = cfg.backbone
    size = next((s for s, dims in _SIZES.items() if dims == (bb.dim, bb.depth, bb.heads)), "tiny")
    return f"{bb.norm}_{size}_patch16_224"


def export_timm(source: str | Path, out: str | Path, head_id: str = "classification",
                force: bool = False) -> tuple[Path, str]:
    """Write ``out`` from a run dir, checkpoint dir or ``.safetensors``; returns (path, timm name).
    An existing ``out`` is replaced only with ``force``, and never when it is the file exported."""
    from foundation import checkpoint
    from foundation.engine.run_state import model_file
    from foundation.engine.model import MultiTaskModel
    from foundation.vit import VisionTransformer
    from foundation_tasks.classification.model import to_vit

    path, out = model_file(source), Path(out)
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder; give the .safetensors file to write")
    if out.exists() and out.samefile(path):
        raise ValueError(f"--out {out} is the model file being exported; write the timm file elsewhere")
    if out.exists() and not force:
        raise ValueError(f"--out {out} already exists; pass --force to replace it")
    model = checkpoint.load(path)
    if isinstance(model, MultiTaskModel):
        if head_id not in model.tasks:
            raise ValueError(f"{path}: no task {head_id!r} in this run (tasks: {', '.join(model.tasks)}); "
                             f"pass --head")
        model = to_vit(model, head_id)
    if not isinstance(model, VisionTransformer):
        raise ValueError(f"{path}: a {type(model).__name__} checkpoint; export timm needs a classification run")
    if model.config.backbone.norm not in ("magneto", "preln"):
        raise ValueError(f"{path}: norm={model.config.backbone.norm!r}; timm's registry has magneto_* and preln_*")
    return checkpoint.save(model.eval(), out), timm_name(model.config)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="foundation export timm", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="a classification run directory (best/, else the last checkpoint), "
                                  "a checkpoint directory or a model.safetensors")
    p.add_argument("--out", required=True, help="the .safetensors to write")
    p.add_argument("--head", default="classification", help="the task id of the classification head")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    args = p.parse_args(argv)
    from foundation.checkpoint import CheckpointError
    from foundation.config import ConfigError

    try:
        out, name = export_timm(args.source, args.out, args.head, args.force)
    except (FileNotFoundError, ValueError, CheckpointError, ConfigError) as e:
        print(f"foundation export timm: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # --out under a file, in a read-only folder, a full disk
        print(f"foundation export timm: cannot write {args.out}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"wrote {out}\nload it with:\n  import foundation, timm\n"
          f"  model = timm.create_model({name!r}, pretrained=True, pretrained_cfg_overlay=dict(file={str(out)!r}))")
    return 0
