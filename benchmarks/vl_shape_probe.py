"""Does a VL demo model's image side see shape? Linear probes on its frozen image features.

    python benchmarks/vl_shape_probe.py runs/demo/vqa/runs/magneto_lr0.001_seed0 [RUN ...]

New one-object demo scenes are drawn with the VL generator (``foundation_tasks.vl_common.demo``, at the
model's image size), encoded by the model's embedding and backbone *without text*, and a
softmax regression on the frozen features (class token, mean and max of the patch tokens)
is trained to name the object's shape (3-way, chance 33.3) and its colour (6-way, chance
16.7); accuracy on held-out scenes. The first row is the same architecture at
initialisation (the first run's config, fresh weights), the reference a trained image side
has to beat. A diagnostic for the image features alone, independent of the question and
the answer head (``vl_breakdown.py`` scores the answers).

What it showed (docs/findings.md, Vision-language): the 1000-step VQA recipe reads colour off its
features but barely more shape than its initialisation does.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from foundation_tasks.mim.linear_probe import probe  # noqa: E402
from foundation_tasks.vl_common.demo import COLORS, SHAPES, SceneSpec, make_scene, render  # noqa: E402


def one_object_scenes(n: int, seed: int, size: int, radius: float) -> tuple[list, torch.Tensor, torch.Tensor]:
    """``n`` one-object scenes: images, shape labels, colour labels."""
    rng = np.random.default_rng([seed, 99])  # not a stream the data generator uses
    spec = SceneSpec(radius=radius, min_objects=1, max_objects=1)
    images, shapes, colours = [], [], []
    for _ in range(n):
        (obj,) = make_scene(rng, spec)
        images.append(render([obj], size, spec.radius, rng))
        shapes.append(SHAPES.index(obj.shape))
        colours.append(list(COLORS).index(obj.color))
    return images, torch.tensor(shapes), torch.tensor(colours)


@torch.no_grad()
def image_features(embed, backbone, transform, images: list, batch: int = 250) -> torch.Tensor:
    """(N, 3 dim): class token, mean and max of the patch tokens, image alone through the backbone."""
    from foundation_tasks.vl_common.beit3 import encode

    out = []
    for i in range(0, len(images), batch):
        x = encode(embed, backbone, images=torch.stack([transform(im) for im in images[i:i + batch]]))
        out.append(torch.cat([x[:, 0], x[:, 1:].mean(1), x[:, 1:].amax(1)], 1))
    return torch.cat(out)


def image_side(run: str) -> dict:
    """A VL run's image side: the BEiT-3 embedding and backbone of its VQA / NLVR2 task, or of
    the first task of a pretraining run (``vl_pretrain``) that takes images, and its eval transform."""
    from foundation import checkpoint
    from foundation.engine.predict import NoPredictor
    from foundation.engine.run_state import model_file
    from foundation_tasks.vl_common.beit3 import BEiT3Embedding

    path = model_file(run)
    model = checkpoint.load(path).eval()
    tids = [t for t, head in getattr(model, "heads", {}).items()
            if isinstance(getattr(head, "embed", None), BEiT3Embedding) and getattr(head.embed, "patch_embed", None)]
    if not tids:
        raise NoPredictor(f"{path} is not a VL run with images (VQA, NLVR2 or vl_pretrain; no BEiT-3 image embedding)")
    task = model.tasks[tids[0]]
    return {"task": tids[0], "embed": model.heads[tids[0]].embed, "backbone": model.backbone,
            "transform": task.image_transform(False), "img_size": task.cfg.img_size}


def untrained_like(path: str, seed: int):
    """The first run's model at initialisation: its config, fresh weights drawn with ``seed``."""
    from foundation import checkpoint
    from foundation.engine.run_state import model_file

    kind, config = checkpoint.read_config(model_file(path))
    torch.manual_seed(seed)
    return checkpoint.MODEL_KINDS[kind].model_cls(config).eval()


def probe_model(name: str, embed, backbone, transform, train, test, seed: int) -> dict:
    (xs, shape, colour), (xs_t, shape_t, colour_t) = train, test
    f, f_t = image_features(embed, backbone, transform, xs), image_features(embed, backbone, transform, xs_t)
    torch.manual_seed(seed)  # the probe's own init: the same for every model
    return {"model": name, "shape": 100 * probe((f, shape), (f_t, shape_t), len(SHAPES)),
            "colour": 100 * probe((f, colour), (f_t, colour_t), len(COLORS))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories / model files of VQA, NLVR2 or VL pretraining runs")
    p.add_argument("--train", type=int, default=1500, help="probe training scenes (default 1500)")
    p.add_argument("--test", type=int, default=500, help="held-out scenes (default 500)")
    p.add_argument("--object-size", type=float, default=SceneSpec().radius, help="object radius, as the generator's")
    p.add_argument("--seed", type=int, default=0, help="scenes, the untrained model's and the probes' init")
    a = p.parse_args(argv)
    from foundation.checkpoint import CheckpointError
    from foundation.config import ConfigError
    from foundation.engine.predict import NoPredictor

    try:
        sides = [(run, image_side(run)) for run in a.runs]
    except (CheckpointError, ConfigError, NoPredictor, FileNotFoundError, ValueError) as e:  # as vl_breakdown
        print(f"vl_shape_probe: {e}", file=sys.stderr)
        return 2
    size = sides[0][1]["img_size"]
    if any(side["img_size"] != size for _, side in sides):
        print("vl_shape_probe: the runs take different image sizes; probe them one at a time", file=sys.stderr)
        return 2
    if min(a.train, a.test) < 3:
        print("vl_shape_probe: --train and --test need at least 3 scenes", file=sys.stderr)
        return 2
    try:
        train = one_object_scenes(a.train, a.seed, size, a.object_size)
        test = one_object_scenes(a.test, a.seed + 1, size, a.object_size)
    except ValueError as e:  # an object size the generator refuses
        print(f"vl_shape_probe: --object-size: {e}", file=sys.stderr)
        return 2
    first = sides[0][1]
    fresh = untrained_like(a.runs[0], a.seed)
    rows = [probe_model("same architecture, untrained", fresh.heads[first["task"]].embed, fresh.backbone,
                        first["transform"], train, test, a.seed)]
    rows += [probe_model(run, s["embed"], s["backbone"], s["transform"], train, test, a.seed) for run, s in sides]
    print(f"linear probes on frozen image features, {a.train} / {a.test} one-object scenes of {size} px")
    print(f"| model | shape (3-way, chance {100 / len(SHAPES):.1f}) | colour (6-way, chance {100 / len(COLORS):.1f}) |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['shape']:.1f} | {r['colour']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
