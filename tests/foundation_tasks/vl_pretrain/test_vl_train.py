"""A short run of the whole vision-language path on demo data, as a user runs it:
`foundation data make vl`, VL pretraining, then VQA and NLVR2 fine-tuning from it
(backbone and embedding through `init_from`), the VQA
predictions file, and errors that reach the command line as one line naming the record."""
import json

import pytest
import torch
from safetensors.torch import load_file

from foundation.cli import main as cli
from test_vl_pretrain import BACKBONE, FRONT, pretrain_tasks

ENGINE = {"log": {"progress": False, "writers": ["jsonl"]}, "optim": {"lr": 2e-3}, "eval": {"max_batches": 2}}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("vl") / "data"
    assert cli(["data", "make", "vl", "--out", str(out), "--seed", "2", "--image-size", "32", "--vqa-train", "12",
                "--vqa-val", "6", "--questions-per-image", "3", "--nlvr2-train", "8", "--nlvr2-dev", "4",
                "--text-lines", "60"]) == 0
    return out


def write_config(path, **sections):
    import yaml

    path.write_text(yaml.safe_dump({**ENGINE, **sections}))
    return str(path)


def test_pretrain_then_vqa_and_nlvr2(demo, tmp_path, capsys):
    out = str(tmp_path / "runs")
    pre = write_config(tmp_path / "pre.yaml", run_name="pre", output_dir=out, backbone=BACKBONE,
                       tasks=pretrain_tasks(demo), train={"steps": 3, "batch_size": 4, "mix": "sum"})
    assert cli(["train", pre]) == 0
    weights = tmp_path / "runs/pre/best/model.safetensors"
    state = load_file(str(weights))
    assert torch.equal(state["heads.text.embed.text_embed.weight"], state["heads.pair.embed.text_embed.weight"])

    vqa_task = {"name": "vqa", **FRONT, "data_dir": str(demo / "vqa"), "min_answer_count": 1}
    vqa = write_config(tmp_path / "vqa.yaml", run_name="vqa", output_dir=out, init_from=str(weights),
                       backbone={**BACKBONE, "final_norm": False}, tasks=[vqa_task], train={"steps": 3, "batch_size": 4})
    assert cli(["train", vqa]) == 0
    printed = capsys.readouterr().out
    assert "init_from" in printed and "vqa/vqa_accuracy" in printed
    tuned = load_file(str(tmp_path / "runs/vqa/best/model.safetensors"))
    # fine-tuning started from the pretrained embedding (3 small steps away from it)
    drift = (tuned["heads.vqa.embed.vision_pos"] - state["heads.image.embed.vision_pos"]).abs().max()
    assert drift < 0.05

    nlvr2_task = {"name": "nlvr2", **FRONT, "data_dir": str(demo / "nlvr2")}
    nlvr2 = write_config(tmp_path / "nlvr2.yaml", run_name="nlvr2", output_dir=out, init_from=str(weights),
                         backbone=BACKBONE, tasks=[nlvr2_task], train={"steps": 2, "batch_size": 4})
    assert cli(["train", nlvr2]) == 0
    assert "nlvr2/accuracy" in capsys.readouterr().out

    # the official results file, from the checkpoint alone
    from foundation_tasks.vqa.predict import main as predict

    results = tmp_path / "results.json"
    assert predict([str(tmp_path / "runs/vqa"), "--split", "val2014", "--out", str(results)]) == 0
    answers = json.loads(results.read_text())
    questions = json.loads((demo / "vqa/v2_OpenEnded_mscoco_val2014_questions.json").read_text())["questions"]
    assert sorted(a["question_id"] for a in answers) == sorted(q["question_id"] for q in questions)
    assert all(set(a) == {"question_id", "answer"} and isinstance(a["answer"], str) for a in answers)
    assert "official VQA accuracy on val2014" in capsys.readouterr().out


def test_data_errors_reach_the_command_line(demo, tmp_path, capsys):
    bad = tmp_path / "vqa"
    bad.mkdir()
    for split in ("train2014", "val2014"):
        for name in (f"v2_OpenEnded_mscoco_{split}_questions.json", f"v2_mscoco_{split}_annotations.json"):
            (bad / name).write_bytes((demo / "vqa" / name).read_bytes())
        (bad / split).symlink_to(demo / "vqa" / split)
    doc = json.loads((bad / "v2_mscoco_train2014_annotations.json").read_text())
    qid = doc["annotations"][1]["question_id"]
    doc["annotations"][1]["answers"] = "yes"
    (bad / "v2_mscoco_train2014_annotations.json").write_text(json.dumps(doc))
    config = write_config(tmp_path / "bad.yaml", output_dir=str(tmp_path / "runs"), backbone=BACKBONE,
                          tasks=[{"name": "vqa", **FRONT, "data_dir": str(bad), "min_answer_count": 1}],
                          train={"steps": 1, "batch_size": 2})
    assert cli(["train", config]) == 2
    err = capsys.readouterr().err
    assert f"annotations.json: question {qid}: field 'answers' must be list" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("norm", ["magneto", "preln"])
def test_paper_configs(norm):
    """Magneto Table 16 / 17 settings parse, and the model they describe has the paper's size."""
    from foundation.engine.config import load_config
    from foundation_tasks.vl_common.beit3 import BEiT3, BEiT3Config

    pre, specs = load_config("configs/vl/pretrain.yaml", [f"backbone.norm={norm}"], check_data=False)
    b = pre.backbone
    assert (b.norm, b.depth, b.dim, b.ffn_dim, b.heads, b.experts) == (norm, 24, 544, 2176, 16, ["vision", "text"])
    assert pre.optim.lr == 2.8e-3 and pre.optim.betas == [0.9, 0.98] and pre.optim.eps == 1e-6
    assert pre.train.mix == "sum" and pre.train.steps == 300_000 and pre.schedule.warmup_steps == 20_000
    assert {s.id: (s.config.kind, s.config.text_mask_ratio, s.config.image_mask_ratio) for s in specs} == {
        "text": ("text", 0.15, 0.4), "image": ("image", None, 0.4), "pair": ("pair", 0.5, 0.4)}
    for task, drop_path, img in (("vqa", 0.1, 384), ("nlvr2", 0.2, 224)):
        extra = ["init_from=null", f"backbone.norm={norm}"] + (["tasks.vqa.answers=[yes,no]"] if task == "vqa" else [])
        cfg, (spec,) = load_config(f"configs/vl/{task}.yaml", extra, check_data=False)
        assert cfg.backbone.drop_path == drop_path and spec.config.img_size == img and cfg.optim.layer_decay == 1.0
        assert cfg.optim.lr in (1e-5, 2e-5, 3e-5) and cfg.train.batch_size * 8 == 128
    with torch.device("meta"):
        model = BEiT3(BEiT3Config(backbone=b, vocab_size=49409, img_size=224, patch_size=16))
    layers = sum(p.numel() for n, p in model.named_parameters() if n.startswith("backbone"))
    assert 165e6 < layers < 175e6  # 24 multiway layers of 544 / 2176


def test_single_task_trains_under_ddp(demo, tmp_path, monkeypatch):
    """DDP (find_unused_parameters=False for one task) refuses parameters without gradients:
    parts of the shared embedding no head uses (VQA: the mask token) are frozen."""
    import torch.distributed as dist

    from foundation.engine.config import resolve
    from foundation.engine.model import ModelConfig, MultiTaskModel

    task = {"name": "vqa", **FRONT, "data_dir": str(demo / "vqa"), "min_answer_count": 1}
    cfg, specs = resolve({"backbone": {**BACKBONE, "final_norm": False}, "tasks": [task]})
    model = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))
    assert not model.heads["vqa"].embed.mask_token.requires_grad
    assert model.heads["vqa"].embed.cls_token.requires_grad
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=False)
        data = model.tasks["vqa"].train_dataset()
        batch = model.tasks["vqa"].collate([data[i] for i in range(4)])
        for _ in range(2):  # the second step is where DDP reports unused parameters
            loss, _ = ddp("vqa", batch)
            loss.backward()
    finally:
        dist.destroy_process_group()
    # a text-only pretraining model freezes the image parts; adding a pair task thaws them
    text_only = [t for t in pretrain_tasks(demo) if t["kind"] == "text"]
    cfg, specs = resolve({"backbone": BACKBONE, "tasks": text_only})
    embed = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs)).heads["text"].embed
    assert not embed.cls_token.requires_grad and embed.text_embed.weight.requires_grad
    cfg, specs = resolve({"backbone": BACKBONE, "tasks": pretrain_tasks(demo)})
    embed = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs)).heads["text"].embed
    assert all(p.requires_grad for p in embed.parameters())
