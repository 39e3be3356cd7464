"""Masked data modeling: masking rates as configured (text 15%, pairs 50%, images 40%
block-wise), the mixing of batch kinds through the engine, and one shared BEiT-3
embedding (and MLM / MIM outputs) across the kinds' heads."""
import collections
import json

import numpy as np
import pytest
import torch

from foundation.config import ConfigError
from foundation.engine.config import resolve
from foundation.engine.data import step_plan
from foundation.engine.model import ModelConfig, MultiTaskModel
from foundation_tasks.vl_common.images import DataError
from foundation_tasks.vl_common.text import get_tokenizer
from foundation_tasks.vl_pretrain.masking import block_masking, mask_text
from support import load_benchmark

BACKBONE = {"dim": 16, "depth": 2, "heads": 2, "ffn_dim": 32, "experts": ["vision", "text"]}
FRONT = {"img_size": 32, "patch_size": 8, "max_text_len": 24, "text_positions": 32}


@pytest.mark.parametrize("grid", [(14, 14), (6, 6), (4, 4)])
def test_block_masking_rate(grid):
    masking = block_masking(grid, 0.4)
    rng = np.random.default_rng(0)
    counts = [int(masking(rng).sum()) for _ in range(300)]
    target = round(0.4 * grid[0] * grid[1])
    assert masking.num_masking_patches == target and max(counts) <= target  # never more than asked
    assert np.mean(counts) >= 0.95 * target  # and almost always exactly that
    m = masking(rng).reshape(grid)
    assert m.any(axis=1).sum() < grid[0] or m.any(axis=0).sum() < grid[1]  # blocks, not scattered patches


@pytest.mark.parametrize("ratio", [0.15, 0.5])
def test_text_masking_rate_and_replacement(ratio):
    rng = np.random.default_rng(1)
    kinds = collections.Counter()
    for n in (7, 20, 40):
        ids = [1000] + list(range(2000, 2000 + n)) + [1001]
        for _ in range(200):
            out, masked = mask_text(ids, ratio, rng, mask_id=5, vocab=(10, 3000), special=(1000, 1001))
            assert sum(masked) == max(1, round(ratio * n)) and not masked[0] and not masked[-1]
            for i in np.flatnonzero(masked):
                kinds["mask" if out[i] == 5 else "same" if out[i] == ids[i] else "random"] += 1
    total = sum(kinds.values())
    assert kinds["mask"] / total == pytest.approx(0.8, abs=0.03)
    assert kinds["random"] / total == pytest.approx(0.1, abs=0.03)


def test_text_masking_prefers_the_given_pieces_then_draws_the_rest():
    ids = [1000] + [2000, 7, 2001, 8, 9, 7, 2002, 2003] + [1001]  # 8 pieces, two of them (7) preferred twice
    rng = np.random.default_rng(0)
    for ratio, n in ((0.15, 1), (0.5, 4)):
        chosen = collections.Counter()
        for _ in range(400):
            _, masked = mask_text(ids, ratio, rng, mask_id=5, vocab=(10, 3000), special=(1000, 1001),
                                  prefer=frozenset({7, 8}))
            where = np.flatnonzero(masked)
            assert len(where) == n and not masked[0] and not masked[-1]
            preferred = [i for i in where if ids[i] in (7, 8)]
            assert len(preferred) == min(n, 3)  # every preferred piece is masked before any other
            chosen.update(int(i) for i in where)
        if n == 1:  # one piece: each of the three preferred positions in turn
            assert set(chosen) == {2, 4, 6} and min(chosen.values()) > 100
        else:  # the fourth at random among the other five
            assert {i for i in chosen if ids[i] not in (7, 8)} == {1, 3, 5, 7, 8}
    # no preferred piece in the text: BERT's draw, the same numbers as without ``prefer``
    plain = [1000, 2000, 2001, 2002, 2003, 1001]
    a = mask_text(plain, 0.5, np.random.default_rng(3), mask_id=5, vocab=(10, 3000), special=(1000, 1001))
    b = mask_text(plain, 0.5, np.random.default_rng(3), mask_id=5, vocab=(10, 3000), special=(1000, 1001),
                  prefer=frozenset({7}))
    assert a == b


@pytest.fixture(scope="module")
def demo(write_vl_demo):
    return write_vl_demo(seed=1, vqa_train=12, vqa_val=6, questions_per_image=2, nlvr2_train=4, nlvr2_dev=4,
                         text_lines=60)


def pretrain_tasks(demo, weights=(1.0, 1.0, 1.0), **extra):
    common = {"name": "vl_pretrain", **FRONT, "visual_vocab_size": 32, "visual_code_dim": 8, **extra}
    return [
        {**common, "id": "text", "kind": "text", "weight": weights[0], "train_data": str(demo / "text/train.txt"),
         "eval_data": str(demo / "text/val.txt")},
        {**common, "id": "image", "kind": "image", "weight": weights[1], "train_data": str(demo / "vqa/train2014"),
         "eval_data": str(demo / "vqa/val2014")},
        {**common, "id": "pair", "kind": "pair", "weight": weights[2],
         "train_data": str(demo / "coco/annotations/captions_train2014.json"), "train_images": str(demo / "vqa/train2014"),
         "eval_data": str(demo / "coco/annotations/captions_val2014.json"), "eval_images": str(demo / "vqa/val2014")},
    ]


def test_masking_rates_in_the_data_match_the_config(demo):
    cfg, specs = resolve({"backbone": BACKBONE, "tasks": pretrain_tasks(demo)})
    model = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))
    tok = get_tokenizer()
    n_patches = (32 // 8) ** 2
    for tid, text_ratio in (("text", 0.15), ("pair", 0.5), ("image", None)):
        task = model.tasks[tid]
        assert task.cfg.text_mask_ratio == text_ratio and task.cfg.image_mask_ratio == 0.4
        data = task.train_dataset()
        batch = task.collate([data[i] for i in range(len(data) if tid == "image" else 12)])
        if text_ratio is not None:
            pieces = (~batch["text_padding_mask"]).sum(1) - 2
            assert torch.equal(batch["text_masked"].sum(1), (pieces * text_ratio).round().clamp(min=1).long())
            assert not batch["text_masked"][:, 0].any()
            assert (batch["text_ids"][batch["text_masked"]] == tok.mask_id).float().mean() > 0.5
        if tid != "text":
            assert batch["vision_mask"].shape[1] == n_patches
            assert batch["vision_mask"].sum(1).max() <= round(0.4 * n_patches)
            assert batch["vision_mask"].float().mean() > 0.9 * 0.4


def test_text_mask_words_mask_the_captions_content_words(demo):
    words = ["red", "green", "blue", "yellow", "purple", "gray", "circle", "square", "triangle"]
    tasks = pretrain_tasks(demo)
    tasks[2]["text_mask_words"] = words
    cfg, specs = resolve({"backbone": BACKBONE, "tasks": tasks})
    task = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs)).tasks["pair"]
    tok, prefer = task.tokenizer, task.mask_word_pieces()
    assert prefer == {tok.pieces(w)[0] for w in words}
    data = task.train_dataset()
    hits = 0
    for i in range(len(data)):
        item = data[i]
        target, masked = item["text_target"], item["text_masked"]
        content = [j for j, t in enumerate(target) if t in prefer]
        n = max(1, round(0.5 * (len(target) - 2)))
        # the content words go first: all of them, or as many as the ratio allows
        assert sum(masked[j] for j in content) == min(len(content), n) and sum(masked) == n
        hits += len(content)
    assert hits > 0
    tasks[2]["text_mask_words"] = []
    with pytest.raises(ConfigError, match="text_mask_words"):
        resolve({"backbone": BACKBONE, "tasks": tasks})
    tasks = pretrain_tasks(demo)
    tasks[1]["text_mask_words"] = words  # the image kind masks no text: an error, not a silent no-op
    with pytest.raises(ConfigError, match="text_mask_words': kind image masks no text"):
        resolve({"backbone": BACKBONE, "tasks": tasks})


def test_the_class_token_names_the_first_masked_word(demo):
    """``class_token_word``: the pair head's pooler reads the class token (token 0, what VQA reads)
    and names each pair's first masked word through the shared MLM output; its loss trains the
    class token, which the masked words at their own positions do not."""
    tasks = pretrain_tasks(demo)
    tasks[2]["class_token_word"] = True
    cfg, specs = resolve({"backbone": BACKBONE, "tasks": tasks})
    model = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))
    task, head = model.tasks["pair"], model.heads["pair"]
    assert head.word is not None and model.heads["text"].word is None
    batch = task.collate([task.train_dataset()[i] for i in range(6)])
    out = head.predict(model.backbone, batch)
    logits, targets = out["word"]
    first = batch["text_masked"].float().argmax(1)
    assert torch.equal(targets, batch["text_targets"][torch.arange(6), first])
    assert logits.shape == (6, head.embed.text_embed.num_embeddings)
    head.embed.cls_token.grad = None
    torch.nn.functional.cross_entropy(logits, targets).backward()
    assert head.embed.cls_token.grad.abs().sum() > 0
    model.zero_grad()
    logits, targets = head.predict(model.backbone, batch)["mlm"]
    torch.nn.functional.cross_entropy(logits, targets).backward()
    assert head.word.dense.weight.grad is None  # the word's pooler is read by nothing else
    with torch.no_grad():
        assert "word_accuracy" in task.metrics(task.eval_step(head, model.backbone, batch))
    tasks[1]["class_token_word"] = True
    with pytest.raises(ConfigError, match="class_token_word': only kind pair"):
        resolve({"backbone": BACKBONE, "tasks": tasks})


def test_kinds_share_one_embedding_and_outputs(demo):
    cfg, specs = resolve({"backbone": BACKBONE, "tasks": pretrain_tasks(demo)})
    model = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))
    heads = model.heads
    assert heads["text"].embed is heads["image"].embed is heads["pair"].embed
    assert heads["text"].mlm is heads["pair"].mlm and heads["image"].mim is heads["pair"].mim
    assert heads["text"].mim is None and heads["image"].mlm is None
    names = [n for n, _ in model.named_parameters() if "text_embed" in n]
    assert names == ["heads.text.embed.text_embed.weight"]  # one parameter, optimised once
    # another model built from the same config gets its own
    other = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))
    assert other.heads["text"].embed is not heads["text"].embed
    assert other.heads["text"].embed is other.heads["pair"].embed
    # front ends that differ cannot share: an error naming the field
    tasks = pretrain_tasks(demo)
    tasks[1]["img_size"] = 48
    cfg, specs = resolve({"backbone": BACKBONE, "tasks": tasks})
    with pytest.raises(ConfigError, match="img_size: 48 here, 32 in vl_pretrain"):
        MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))


def test_mixing_of_batch_kinds_follows_the_config(demo, tmp_path):
    """The engine draws the kinds as configured: every kind every step (sum) or one kind per
    step with probability ~ weight (sample); a real run follows the same plan."""
    ids, weights = ["text", "image", "pair"], [2.0, 1.0, 1.0]
    drawn = collections.Counter(step_plan("sample", ids, weights, s, seed=0)[0][0] for s in range(4000))
    for tid, w in zip(ids, weights):
        assert drawn[tid] / 4000 == pytest.approx(w / sum(weights), abs=0.03)
    assert all([t for t, _ in step_plan("sum", ids, weights, s, 0)] == ids for s in range(5))

    from foundation.engine.loop import train

    steps = 8
    raw = {"backbone": BACKBONE, "tasks": pretrain_tasks(demo, weights), "output_dir": str(tmp_path), "run_name": "mix",
           "train": {"steps": steps, "batch_size": 4, "mix": "sample"}, "eval": {"max_batches": 1},
           "log": {"progress": False, "writers": ["jsonl"]}, "optim": {"lr": 1e-3}}
    cfg, specs = resolve(raw)
    result = train(cfg, specs)
    assert result.status == "finished"
    records = [json.loads(l) for l in (tmp_path / "mix/metrics.jsonl").read_text().splitlines()]
    per_step = {r["step"]: {k[5:] for k in r if k.startswith("loss/")} for r in records if "loss" in r}
    for s in range(steps):
        assert per_step[s + 1] == {step_plan("sample", ids, weights, s, cfg.seed)[0][0]}
    assert {"text/mlm_accuracy", "image/mim_accuracy", "pair/mlm_accuracy", "pair/mim_accuracy"} <= set(result.metrics)


def test_vq_tokenizer_is_pluggable(monkeypatch):
    """visual_tokenizer: vq_tokenizer loads a foundation_tasks/vq_tokenizer run and feeds it
    ImageNet-normalised images; its grid must be ours."""
    from foundation.config import build
    from foundation_tasks.vl_pretrain.task import VLPretrainConfig
    from foundation_tasks.vl_pretrain.visual_tokenizer import IMAGENET_MEAN, IMAGENET_STD, build_visual_tokenizer

    seen = {}

    class Stub(torch.nn.Module):
        grid, num_codes = (4, 4), 77

        def forward(self, x):
            seen["x"] = x
            return torch.zeros(x.shape[0], 16, dtype=torch.long)

    monkeypatch.setattr("foundation_tasks.vision_common.tokenizer.load_tokenizer", lambda path: Stub())
    cfg = build(VLPretrainConfig, {"kind": "image", "visual_tokenizer": "vq_tokenizer", "visual_tokenizer_path": "x",
                                   **FRONT})
    tok = build_visual_tokenizer(cfg)
    assert tok.vocab_size == 77 and list(tok.state_dict()) == []  # frozen and not saved with the head
    pixels = torch.rand(2, 3, 32, 32)
    ours = (pixels - 0.5) / 0.5  # the VL normalisation (image_mean = image_std = 0.5)
    tok(ours)
    expected = (pixels - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    assert torch.allclose(seen["x"], expected, atol=1e-6)
    with pytest.raises(ConfigError, match="patch grid"):
        build_visual_tokenizer(build(VLPretrainConfig, {**cfg.__dict__, "img_size": 48}))
    with pytest.raises(ConfigError, match="visual_tokenizer_path"):
        build(VLPretrainConfig, {"kind": "pair", "visual_tokenizer": "vq_tokenizer", **FRONT})


def test_pixel_target_regresses_normalised_patches(demo, tmp_path):
    """visual_tokenizer: pixels: the masked patches' pixels, each patch standardised (MAE's
    norm_pix_loss), by mean squared error; the image entry then selects its best checkpoint
    by that error and the pair entry still reports its MLM accuracy."""
    from foundation.engine.loop import train

    cfg, specs = resolve({"backbone": BACKBONE, "tasks": pretrain_tasks(demo, visual_tokenizer="pixels")})
    model = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))
    head, task = model.heads["image"], model.tasks["image"]
    assert head.mim.proj.out_features == 8 * 8 * 3 and list(head.mim.visual_tokenizer.state_dict()) == []
    assert task.primary(task.cfg) == ("mim_pix_loss", False)
    assert model.tasks["pair"].primary(model.tasks["pair"].cfg) == ("accuracy", True)
    batch = task.collate([task.train_dataset()[i] for i in range(4)])
    (pred, target), = head.predict(model.backbone, batch).values()
    r, c = divmod(int(batch["vision_mask"][0].nonzero()[0]), 4)  # image 0's first masked patch: target 0
    patch = batch["images"][0, :, 8 * r:8 * r + 8, 8 * c:8 * c + 8].permute(1, 2, 0).reshape(-1)  # (row, col, channel)
    assert torch.allclose(target[0], (patch - patch.mean()) / (patch.var() + 1e-6).sqrt(), atol=1e-5)
    assert target.shape == (int(batch["vision_mask"].sum()), 192) and pred.shape == target.shape
    loss, logs = head(model.backbone, batch)
    assert "mim_acc" not in logs and torch.allclose(loss, torch.nn.functional.mse_loss(pred, target))

    raw = {"backbone": BACKBONE, "tasks": pretrain_tasks(demo, visual_tokenizer="pixels"), "output_dir": str(tmp_path),
           "run_name": "pix", "train": {"steps": 4, "batch_size": 4}, "eval": {"max_batches": 1},
           "log": {"progress": False, "writers": ["jsonl"]}, "optim": {"lr": 1e-3}}
    result = train(*resolve(raw))
    assert result.status == "finished"
    assert {"image/mim_pix_loss", "pair/mim_pix_loss", "pair/mlm_accuracy", "pair/accuracy"} <= set(result.metrics)
    assert "image/accuracy" not in result.metrics and 0 < result.metrics["image/mim_pix_loss"] < 3


def test_caption_reader_errors_name_the_record(vl_demo_copy):
    from foundation_tasks.vl_pretrain.data import read_captions

    data = vl_demo_copy
    path = data / "coco/annotations/captions_train2014.json"
    assert len(read_captions(path, data / "vqa/train2014")) == 24
    doc = json.loads(path.read_text())
    doc["annotations"][5]["caption"] = None
    path.write_text(json.dumps(doc))
    with pytest.raises(DataError, match=r"annotations\[5\]: expected"):
        read_captions(path, data / "vqa/train2014")


def match_task(demo, **extra):
    return {"name": "vl_pretrain", **FRONT, "id": "match", "kind": "match", **extra,
            "train_data": str(demo / "coco/annotations/captions_train2014.json"), "train_images": str(demo / "vqa/train2014"),
            "eval_data": str(demo / "coco/annotations/captions_val2014.json"), "eval_images": str(demo / "vqa/val2014")}


def test_image_text_matching_pairs_half_with_another_images_caption(demo, tmp_path, capsys):
    """kind: match: unmasked pairs, about half of them carrying a caption of a different image
    (label 0), the same items at every evaluation; a binary head on the pooled first token,
    sharing the embedding with the masked-modeling entries; trains through the engine."""
    from foundation.engine.loop import train
    from foundation_tasks.vl_pretrain.data import read_captions

    tasks = pretrain_tasks(demo) + [match_task(demo)]
    cfg, specs = resolve({"backbone": BACKBONE, "tasks": tasks})
    model = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))
    head, task = model.heads["match"], model.tasks["match"]
    assert head.embed is model.heads["pair"].embed and head.mlm is None and head.mim is None
    tok = get_tokenizer()
    records = read_captions(demo / "coco/annotations/captions_train2014.json", demo / "vqa/train2014")
    captions_of = collections.defaultdict(set)
    for image, caption, _ in records:
        captions_of[image].add(tuple(tok.encode(caption, FRONT["max_text_len"])))
    assert len(captions_of) < len(records)  # images with several captions: a negative is none of them
    data = task.train_dataset()
    items = [data[i] for i in range(len(data))]
    labels = [it["match"] for it in items]
    assert 0.2 < sum(labels) / len(labels) < 0.8 and tok.mask_id not in {t for it in items for t in it["text"]}
    for it, (image, _, _) in zip(items, records):
        assert (tuple(it["text"]) in captions_of[image]) == bool(it["match"])  # a negative never describes its image
    evals = task.eval_dataset()
    assert [evals[i]["text"] for i in range(6)] == [evals[i]["text"] for i in range(6)]  # fixed at evaluation
    batch = task.collate(items[:6])
    assert set(batch) == {"text_ids", "text_padding_mask", "images", "match_labels"}
    (logits, target), = head.predict(model.backbone, batch).values()
    assert logits.shape == (6, 2) and torch.equal(target, batch["match_labels"])

    raw = {"backbone": BACKBONE, "tasks": tasks, "output_dir": str(tmp_path), "run_name": "itm",
           "train": {"steps": 4, "batch_size": 4}, "eval": {"max_batches": 1},
           "log": {"progress": False, "writers": ["jsonl"]}, "optim": {"lr": 1e-3}}
    result = train(*resolve(raw))
    assert result.status == "finished" and 0 <= result.metrics["match/itm_accuracy"] <= 1
    assert {"loss/match", "match/itm_acc"} <= {k for line in (tmp_path / "itm/metrics.jsonl").read_text().splitlines()
                                              for k in json.loads(line)}

    # benchmarks/vl_grounding_probe.py on that run: each probed word is one of its kind's, masked alone;
    # one row per model under the untrained reference; a run without a pair entry is refused in one line
    grounding = load_benchmark("vl_grounding_probe")
    model = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))
    items = grounding.caption_items(model, "pair", 12)
    kinds = grounding.word_ids(tok)
    assert items and all(kinds[ids[j]] == kind for ids, j, kind, _ in items)
    assert {"colour", "shape", "count"} <= {kind for *_, kind, _ in items}
    res = grounding.score(model, "pair", items)
    assert sum(r[0] for r in res.values()) == len(items) and all(0 <= r[1] <= r[0] and 0 <= r[2] <= r[0] for r in res.values())
    assert grounding.main([str(tmp_path / "itm"), "--captions", "12"]) == 0
    out = capsys.readouterr().out
    assert "| same architecture, untrained |" in out and f"| {tmp_path / 'itm'} |" in out
    raw["tasks"], raw["run_name"] = [match_task(demo)], "itm-only"
    assert train(*resolve(raw)).status == "finished"
    assert grounding.main([str(tmp_path / "itm-only")]) == 2
    assert "not a VL pretraining run with a pair entry" in capsys.readouterr().err


def test_image_text_matching_refuses_captions_that_leave_no_negative(vl_demo_copy):
    from foundation_tasks.vl_pretrain.data import MaskedDataset

    image = next((vl_demo_copy / "vqa/train2014").iterdir())
    records = [(image, "A red square.", "captions.json: annotations[0]"), (image, "Two squares.", "captions.json: annotations[1]")]
    with pytest.raises(DataError, match=r"annotations\[0\]: image-text matching needs a caption that does not describe"):
        MaskedDataset("match", records, tokenizer=get_tokenizer(), max_text_len=24, transform=None, train=True,
                      text_ratio=0.0, image_masking=None)
