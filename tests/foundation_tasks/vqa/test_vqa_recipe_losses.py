"""What the tiny VQA recipe adds to BEiT-3's loss. Per-patch object labels: the demo's COCO
instances agree with its images, the labels follow open_clip's evaluation transform, bad
records are named, and a VQA run with them trains the patch classifier and still predicts
without the annotation file. Answer-type weights: the weighted mean of BEiT-3's per-question
loss, each question weighted by its annotation's answer_type."""
import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from foundation.config import ConfigError
from foundation_tasks.vl_common.images import DataError, image_transform
from foundation_tasks.vl_common.objects import patch_labels, read_objects
from foundation_tasks.vl_common.demo import COLORS

BACKBONE = {"dim": 32, "depth": 2, "heads": 2, "ffn_dim": 64, "experts": ["vision", "text"], "final_norm": False}
FRONT = {"img_size": 32, "patch_size": 8, "max_text_len": 16, "text_positions": 16}
INSTANCES = "../coco/annotations/instances_{split}.json"


def test_demo_instances_match_the_images(vl_demo):
    """Each labelled patch of a demo image shows its category's colour: the polygons are where
    the generator drew the objects."""
    objects = read_objects(vl_demo / "coco/annotations/instances_train2014.json")
    assert objects.categories[:2] == ["red circle", "red square"] and len(objects.categories) == 18
    doc = json.loads((vl_demo / "coco/annotations/instances_train2014.json").read_text())
    assert {"id", "image_id", "category_id", "segmentation", "area", "bbox", "iscrowd"} <= set(doc["annotations"][0])
    checked = 0
    for image in doc["images"]:
        pixels = np.asarray(Image.open(vl_demo / "vqa/train2014" / image["file_name"]), dtype=np.float64)
        labels = objects.labels_of(image["id"], image["width"], image["height"], 32, 8).reshape(4, 4)
        assert (labels < 18).any()  # every scene has an object of at least a patch's quarter
        for (r, c), label in np.ndenumerate(labels.numpy()):
            if label == 18:
                continue
            patch = pixels[8 * r:8 * r + 8, 8 * c:8 * c + 8].reshape(-1, 3)
            colour = objects.categories[label].split()[0]
            near = {name: np.linalg.norm(patch - rgb, axis=1) < 60 for name, rgb in COLORS.items()}
            assert near[colour].mean() >= 0.1, (image["file_name"], r, c, colour)
            assert all(near[other].mean() < near[colour].mean() for other in COLORS if other != colour)
            checked += 1
    assert checked > 20


def test_labels_follow_open_clips_evaluation_transform():
    """A 60 x 40 image (resized to 32 on its short side, then centre-cropped): the labels are the
    patches the transformed image's object covers."""
    box = [30, 4, 52, 4, 52, 30, 30, 30]  # a rectangle in the right half
    tri = [2, 36, 20, 36, 10, 20]
    labels = patch_labels([(0, [box]), (1, [tri])], background=2, width=60, height=40, img_size=32, patch_size=8)
    image = Image.new("RGB", (60, 40), (0, 0, 0))
    draw = ImageDraw.Draw(image)
    draw.polygon(list(zip(box[0::2], box[1::2])), fill=(255, 0, 0))
    draw.polygon(list(zip(tri[0::2], tri[1::2])), fill=(0, 255, 0))
    seen = image_transform(32, False, [0, 0, 0], [1, 1, 1])(image)  # (3, 32, 32), what the model gets
    cover = seen.clamp(0, 1).reshape(3, 4, 8, 4, 8).mean((2, 4)).reshape(3, -1)
    for p in range(16):
        if cover[0, p] > 0.35:
            assert labels[p] == 0, p
        elif cover[1, p] > 0.35:
            assert labels[p] == 1, p
        elif cover[:2, p].max() < 0.15:
            assert labels[p] == 2, p
    assert (labels == 0).sum() >= 4 and (labels == 1).sum() >= 1


def test_patch_tokens_of_the_chosen_block_name_their_objects():
    """The object loss is the cross-entropy of a linear classifier on the patch tokens after
    ``object_block`` (the class token left out) against the labels, background the last class;
    the answers still come from the last layer."""
    from foundation_tasks.vqa.model import VQAHead

    torch.manual_seed(0)
    head = VQAHead(_FakeEmbed(), 8, 3, num_objects=2, object_block=0)
    assert head.objects.out_features == 3  # two categories + background
    labels = torch.tensor([[0, 1, 2, 2]])  # red circle, blue circle, background x2
    early, last = torch.randn(1, 5, 8), torch.randn(1, 5, 8)  # class token + 4 patches
    logits, objects = head._forward(_Backbone(last, {0: early}), {"object_labels": labels, "text_ids": None,
                                                                  "text_padding_mask": None, "images": None})
    expected = torch.nn.functional.cross_entropy(head.objects(early[0, 1:]), labels[0])
    assert torch.allclose(objects, expected)
    assert torch.allclose(logits, head.head(head.pooler(last)))
    logits, objects = head._forward(_Backbone(last, {0: early}), {"text_ids": None, "text_padding_mask": None,
                                                                  "images": None})
    assert objects is None  # evaluation batches carry no labels


def test_max_pool_reads_the_largest_patch_value_and_ignores_the_text():
    """``pool: max``: the pooler reads the element-wise max over the image's patch tokens; the
    class token and the text tokens after the image play no part."""
    from foundation_tasks.vqa.model import VQAHead

    torch.manual_seed(0)
    head = VQAHead(_FakeEmbed(), 8, 3, pool="max")
    last = torch.randn(2, 5 + 3, 8)  # class token + 4 patches, then 3 text tokens
    batch = {"text_ids": None, "text_padding_mask": None, "images": None}
    logits = head.logits(_Backbone(last, {}), batch)
    assert torch.allclose(logits, head.head(head.pooler(last[:, 1:5].amax(1, keepdim=True))))
    other = last.clone()
    other[:, 0] = 3 * torch.randn(2, 8)
    other[:, 5:] = 3 * torch.randn(2, 3, 8)
    assert torch.equal(head.logits(_Backbone(other, {}), batch), logits)
    cls = VQAHead(_FakeEmbed(), 8, 3)  # BEiT-3's: the class token moved, so does the answer
    assert not torch.allclose(cls.logits(_Backbone(other, {}), batch), cls.logits(_Backbone(last, {}), batch))
    with pytest.raises(ValueError, match="pool"):
        VQAHead(_FakeEmbed(), 8, 3, pool="mean")


def test_nlvr2_max_pool_reads_each_images_patches_beside_the_texts_first_token():
    """NLVR2's ``pool: max`` (for a start trained with VQA's ``pool: max``): each image-text pair
    gives the max over that image's patch tokens and the text's first token; the class token
    plays no part. The default reads the class token, as BEiT-3."""
    from foundation_tasks.nlvr2.model import NLVR2Head

    torch.manual_seed(0)
    head = NLVR2Head(_FakeEmbed(), 8, pool="max", init_scale=1.0)
    x = torch.randn(4, 5 + 3, 8)  # (left pairs; right pairs) x (class token + 4 patches, 3 text tokens)
    batch = {"text_ids": torch.zeros(2, 3, dtype=torch.long), "text_padding_mask": torch.zeros(2, 3, dtype=torch.bool),
             "left": torch.zeros(2, 1), "right": torch.zeros(2, 1)}
    logits = head.logits(_Backbone(x, {}), batch)
    pair = torch.cat([x[:, 1:5].amax(1), x[:, 5]], -1)
    assert torch.allclose(logits, head.head(torch.cat([pair[:2], pair[2:]], -1)))
    other = x.clone()
    other[:, 0] = 3 * torch.randn(4, 8)
    assert torch.equal(head.logits(_Backbone(other, {}), batch), logits)
    cls = NLVR2Head(_FakeEmbed(), 8, init_scale=1.0)
    assert not torch.allclose(cls.logits(_Backbone(other, {}), batch), cls.logits(_Backbone(x, {}), batch))
    with pytest.raises(ValueError, match="pool"):
        NLVR2Head(_FakeEmbed(), 8, pool="mean")


class _FakeEmbed(torch.nn.Module):
    num_vision_tokens = 5

    def forward(self, **inputs):
        return None, None, None

    def no_weight_decay(self):
        return []


class _Backbone(torch.nn.Module):
    def __init__(self, last, layers):
        super().__init__()
        self.last, self.layers = last, layers

    def forward(self, x, padding, segments=None, return_layers=None):
        return self.last if return_layers is None else (self.last, {i: self.layers[i] for i in return_layers})


def test_instances_errors_name_the_record(tmp_path, vl_demo):
    doc = json.loads((vl_demo / "coco/annotations/instances_train2014.json").read_text())
    path = tmp_path / "instances_train2014.json"

    def broken(change):
        bad = json.loads(json.dumps(doc))
        change(bad)
        path.write_text(json.dumps(bad))
        return path

    with pytest.raises(DataError, match=r"annotations\[2\]: 'category_id' 99 is not among"):
        read_objects(broken(lambda d: d["annotations"][2].update(category_id=99)))
    with pytest.raises(DataError, match=r"annotations\[0\]: 'segmentation' must be a list of polygons"):
        read_objects(broken(lambda d: d["annotations"][0].update(segmentation=[[1, 2, 3, 4]])))
    with pytest.raises(DataError, match=r"annotations\[1\]: 'image_id' must name one of the file's images"):
        read_objects(broken(lambda d: d["annotations"][1].update(image_id=-5)))
    crowd = read_objects(broken(lambda d: d["annotations"][0].update(iscrowd=1, segmentation={"counts": [1]})))
    full = read_objects(vl_demo / "coco/annotations/instances_train2014.json")
    first = doc["annotations"][0]["image_id"]
    assert len(crowd.by_image[first]) == len(full.by_image[first]) - 1  # crowd regions left out
    with pytest.raises(DataError, match=r"image 424242 is not among its images"):
        full.labels_of(424242, 32, 32, 32, 8)


def test_dataset_labels_are_drawn_once_per_image_and_name_the_question(vl_demo):
    """What the VQA dataset gets: an image's labels (the same every time it is asked, drawn
    once), and an image the instances file lacks names the question record and the file."""
    from foundation_tasks.vqa.data import ObjectLabels, read_split

    objects = read_objects(vl_demo / "coco/annotations/instances_train2014.json")
    labels = ObjectLabels(objects, 32, 8)
    q = read_split(vl_demo / "vqa", vl_demo / "vqa", "train2014")[0]
    first = labels(q, 32, 32)
    assert first.dtype == torch.long and torch.equal(first, objects.labels_of(q.image_id, 32, 32, 32, 8))
    objects.by_image[q.image_id] = []  # a later change to the file's objects is not seen: drawn once
    assert torch.equal(labels(q, 32, 32), first)
    missing = dataclasses.replace(q, image_id=424242)
    with pytest.raises(DataError, match=r"question .*image 424242 is not among its images"):
        labels(missing, 32, 32)


def vqa_config(tmp_path, data, **task):
    return {"run_name": "vqa", "output_dir": str(tmp_path / "runs"), "seed": 0, "backbone": BACKBONE,
            "tasks": [{"name": "vqa", **FRONT, "data_dir": str(data / "vqa"), "min_answer_count": 1,
                       "head_init_std": 0.125, **task}],
            "optim": {"lr": 3e-3}, "schedule": {"warmup_steps": 1}, "train": {"steps": 40, "batch_size": 12},
            "eval": {"every": 40, "max_batches": 1}, "save": {"every": 40, "keep": 1},
            "log": {"progress": False, "writers": ["jsonl"]}}


def test_vqa_trains_the_patch_classifier(vl_demo_copy, tmp_path, run_config, run_records):
    from foundation import load_predictor

    data = vl_demo_copy
    run_config(vqa_config(tmp_path, data, object_annotations=INSTANCES, object_loss_block=1, pool="max"))
    run = tmp_path / "runs/vqa"
    losses = [r["vqa/object_loss"] for r in run_records(run) if "vqa/object_loss" in r]
    assert len(losses) == 40 and np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])  # the patches learn their objects
    saved = (run / "config.yaml").read_text()
    assert "red circle" in saved and "pool: max" in saved  # the categories and the pooling travel with the run
    # the trained model answers without the annotation file or the data
    shutil.rmtree(data / "coco")
    predictor = load_predictor(run, device="cpu")
    image = next((data / "vqa/val2014").glob("*.jpg"))
    assert predictor(str(image), question="What color is the circle?")["answers"]


def test_object_label_config_errors(vl_demo, tmp_path, run_config):
    from foundation.config import build
    from foundation_tasks.vqa.task import VQAConfig

    with pytest.raises(ConfigError, match=r"field 'object_annotations': .*instances_train2014\.json not found"):
        build(VQAConfig, {"data_dir": str(vl_demo / "vqa"), "min_answer_count": 1, "object_annotations": "x/instances_{split}.json"})
    with pytest.raises(ConfigError, match="field 'object_loss_block': 3 is past the backbone's 2 blocks"):
        run_config(vqa_config(tmp_path, vl_demo, object_annotations=INSTANCES, object_loss_block=3))
    with pytest.raises(ConfigError, match="field 'object_annotations': per-patch object labels need"):
        run_config(vqa_config(tmp_path, vl_demo, object_annotations=INSTANCES, train_crop_scale=[0.5, 1.0]))


def test_answer_type_weights_weight_each_question(vl_demo):
    from foundation.config import build
    from foundation_tasks.vqa.data import VQADataset, collate, read_split
    from foundation_tasks.vqa.model import VQAHead
    from foundation_tasks.vqa.task import VQAConfig

    cfg = build(VQAConfig, {"data_dir": str(vl_demo / "vqa"), "min_answer_count": 1,
                            "answer_type_weights": {"yes/no": 6.0, "number": 0.5}})
    questions = read_split(vl_demo / "vqa", vl_demo / "vqa", "train2014")
    data = VQADataset(questions, cfg.answers, _Tokens(), 16, lambda im: torch.zeros(3, 2, 2), True,
                      answer_type_weights=cfg.answer_type_weights)
    batch = collate([data[i] for i in range(len(data))], 0, len(cfg.answers))
    expected = [{"yes/no": 6.0, "number": 0.5}.get(t, 1.0) for t in batch["answer_type"]]
    assert batch["loss_weight"].tolist() == expected and {"yes/no", "number", "other"} <= set(batch["answer_type"])
    logits = torch.randn(len(expected), len(cfg.answers))
    per_question = [torch.nn.functional.binary_cross_entropy_with_logits(l, t, reduction="sum")
                    for l, t in zip(logits, batch["targets"])]
    weighted = sum(w * l for w, l in zip(expected, per_question)) / sum(expected)
    assert torch.allclose(VQAHead.loss(logits, batch["targets"], weights=batch["loss_weight"]), weighted)
    assert torch.allclose(VQAHead.loss(logits, batch["targets"]), sum(per_question) / len(per_question))
    plain = VQADataset(questions, cfg.answers, _Tokens(), 16, lambda im: torch.zeros(3, 2, 2), True)
    assert "loss_weight" not in collate([plain[0], plain[1]], 0, len(cfg.answers))
    with pytest.raises(ConfigError, match="field 'answer_type_weights': weights must be > 0"):
        build(VQAConfig, {"answers": ["yes"], "answer_type_weights": {"yes/no": 0}})


class _Tokens:
    def encode(self, text, max_len):
        return [1, 2, 3]
