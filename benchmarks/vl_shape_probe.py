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
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories / model files of VQA or NLVR2 runs")
    p.add_argument("--train", type=int, default=1500, help="probe training scenes (default 1500)")
    p.add_argument("--test", type=int, default=500, help="held-out scenes (default 500)")
    p.add_argument("--object-size", type=float, default=SceneSpec().radius, help="object radius, as the generator's")
    p.add_argument("--seed", type=int, default=0, help="scenes, the untrained model's and the probes' init")
    a = p.parse_args(argv)
    from foundation.checkpoint import CheckpointError
    from foundation.config import ConfigError
    from foundation.engine.predict import NoPredictor, load_predictor

    try:
        predictors = [(run, load_predictor(run, device="cpu")) for run in a.runs]
    except (CheckpointError, ConfigError, NoPredictor, FileNotFoundError, ValueError) as e:  # as vl_breakdown
        print(f"vl_shape_probe: {e}", file=sys.stderr)
        return 2
    from foundation_tasks.vl_common.beit3 import BEiT3Embedding

    not_vl = [run for run, pr in predictors if not isinstance(getattr(pr.head, "embed", None), BEiT3Embedding)]
    if not_vl:
        print(f"vl_shape_probe: {not_vl[0]} is not a VQA / NLVR2 run (its head has no BEiT-3 embedding)", file=sys.stderr)
        return 2
    size = predictors[0][1].meta["img_size"]
    if any(pr.meta["img_size"] != size for _, pr in predictors):
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
    first = predictors[0][1]
    fresh = untrained_like(a.runs[0], a.seed)
    tid = next(t for t, head in fresh.heads.items() if isinstance(getattr(head, "embed", None), BEiT3Embedding))
    rows = [probe_model("same architecture, untrained", fresh.heads[tid].embed, fresh.backbone, first.transform,
                        train, test, a.seed)]
    rows += [probe_model(run, pr.head.embed, pr.backbone, pr.transform, train, test, a.seed) for run, pr in predictors]
    print(f"linear probes on frozen image features, {a.train} / {a.test} one-object scenes of {size} px")
    print(f"| model | shape (3-way, chance {100 / len(SHAPES):.1f}) | colour (6-way, chance {100 / len(COLORS):.1f}) |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['shape']:.1f} | {r['colour']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
