"""Does a VL pretraining read its captions' words off the image? Zero-shot, on held-out captions.

    python benchmarks/vl_grounding_probe.py runs/vl-pretrain [RUN ...]

For every held-out caption of a VL pretraining run's ``pair`` entry, each word that names a
colour, a shape, a count or a spatial relation (the demo's scene vocabulary,
``foundation_tasks.vl_common.scenes``) is masked alone and predicted by the run's MLM output
twice: with the image visible, and with every patch masked (what the caption's other words
alone give). A model that grounds its words reads colours and shapes far better with the
image; one that learnt the captions' language only scores the same both ways. The first row
is the first run's architecture at initialisation. A diagnostic of what the pretraining
learnt, independent of any fine-tuning (``vl_shape_probe.py`` probes the image features alone).

What it showed (docs/findings.md, Vision-language): BEiT-3's masked data modeling at the demo's
size reads colours and shapes barely better with the image than without it.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from foundation_tasks.vl_common.scenes import COLORS, NUMBER_WORDS, RELATIONS, SHAPES  # noqa: E402

KINDS = {"colour": list(COLORS), "shape": list(SHAPES) + [s + "s" for s in SHAPES], "count": list(NUMBER_WORDS),
         "relation": list(RELATIONS) + ["above", "below"]}


def word_ids(tokenizer) -> dict[int, str]:
    """Piece id -> kind, for the kinds' words that are one piece (CLIP's BPE splits a few plurals)."""
    out = {}
    for kind, words in KINDS.items():
        for word in words:
            pieces = tokenizer.pieces(word)
            if len(pieces) == 1:
                out[pieces[0]] = kind
    return out


@torch.no_grad()
def score(model, task_id: str, items: list, batch: int = 128) -> dict[str, list[int]]:
    """kind -> [words, right with the image, right with every patch masked]."""
    from foundation_tasks.vl_common.text import pad_texts

    head, tok = model.heads[task_id], model.tasks[task_id].tokenizer
    patches = head.embed.num_vision_tokens - 1
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for i in range(0, len(items), batch):
        chunk = items[i:i + batch]
        texts = [ids[:j] + [tok.mask_id] + ids[j + 1:] for ids, j, _, _ in chunk]
        text, padding = pad_texts(texts, tok.pad_id)
        images = torch.stack([image for _, _, _, image in chunk])
        where = torch.tensor([j for _, j, _, _ in chunk])
        right = []
        for hidden_all in (False, True):
            vision_mask = torch.full((len(chunk), patches), hidden_all)
            x, pad, segments = head.embed(text_ids=text, text_padding_mask=padding, images=images, vision_mask=vision_mask)
            hidden = model.backbone(x, pad, segments=segments)[:, head.embed.num_vision_tokens:]
            logits = head.mlm(hidden[torch.arange(len(chunk)), where], head.embed)
            right.append(logits.argmax(-1).tolist())
        for k, (ids, j, kind, _) in enumerate(chunk):
            row = out[kind]
            row[0] += 1
            row[1] += int(right[0][k] == ids[j])
            row[2] += int(right[1][k] == ids[j])
    return out


def caption_items(model, task_id: str, limit: int) -> list:
    """(ids, position, kind, image) for each probed word of the first ``limit`` held-out captions."""
    from foundation_tasks.vl_common.images import load_image, transform_image
    from foundation_tasks.vl_pretrain.data import read_captions

    task = model.tasks[task_id]
    tok, transform = task.tokenizer, task.image_transform(False)
    kinds = word_ids(tok)
    items = []
    for path, caption, record in read_captions(task.cfg.eval_data, task.cfg.eval_images)[:limit]:
        ids = tok.encode(caption, task.cfg.max_text_len)
        image = transform_image(transform, load_image(path, record), None, record)
        items += [(ids, j, kinds[t], image) for j, t in enumerate(ids) if t in kinds]
    return items


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN", help="VL pretraining runs (run directories or model files) with a pair entry")
    p.add_argument("--captions", type=int, default=1000, help="held-out captions probed (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="the untrained model's init")
    a = p.parse_args(argv)
    from foundation import checkpoint
    from foundation.checkpoint import CheckpointError
    from foundation.config import ConfigError
    from foundation.engine.run_state import model_file
    from foundation_tasks.vl_pretrain.data import DataError

    try:
        models = [(run, checkpoint.load(model_file(run)).eval()) for run in a.runs]
        pairs = [next((t for t, task in m.tasks.items() if getattr(task.cfg, "kind", None) == "pair"), None)
                 for _, m in models]
        if None in pairs:
            raise ConfigError(f"{a.runs[pairs.index(None)]}: not a VL pretraining run with a pair entry (kind: pair)")
        kind, config = checkpoint.read_config(model_file(a.runs[0]))
        torch.manual_seed(a.seed)
        fresh = checkpoint.MODEL_KINDS[kind].model_cls(config).eval()
        items = caption_items(models[0][1], pairs[0], a.captions)
    except (CheckpointError, ConfigError, DataError, FileNotFoundError, ValueError) as e:
        print(f"vl_grounding_probe: {e}", file=sys.stderr)
        return 2
    rows = [("same architecture, untrained", score(fresh, pairs[0], items))]
    rows += [(run, score(m, tid, items)) for (run, m), tid in zip(models, pairs)]
    print(f"one masked word of {a.captions} held-out captions, predicted with the image / with every patch masked (%)")
    print("| model | " + " | ".join(f"{k} (n {rows[0][1][k][0]})" for k in KINDS if k in rows[0][1]) + " |")
    print("|---|" + "---|" * sum(k in rows[0][1] for k in KINDS))
    for name, res in rows:
        cells = [f"{100 * r[1] / r[0]:.1f} / {100 * r[2] / r[0]:.1f}" for k, r in ((k, res[k]) for k in KINDS if k in res)]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
