"""Cross-modal pretraining of one backbone: vision MIM, BEiT-3 masked data modeling and
BEST-RQ speech (tests/foundation_tasks/best_rq) through the engine's multi-task mix. A step of one modality
updates that modality's expert (and what is shared) and no other; a plain backbone
fine-tuned from a multiway checkpoint takes the right expert's weights."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from foundation import checkpoint
from foundation.config import ConfigError
from foundation.engine.config import OptimConfig, resolve
from foundation.engine.loop import build_model, train
from foundation.engine.init import load_init_from
from foundation.engine.model import ModelConfig, MultiTaskModel
from foundation.engine.optim import build_optimizer
from foundation.multiway import adapt_state, state_experts
from support import write_vision_demo

REPO = Path(__file__).resolve().parents[2]
BACKBONE = {"dim": 16, "depth": 2, "heads": 2, "ffn_dim": 32, "rel_pos": "1d"}
EXPERTS = ["vision", "text", "speech"]
ENGINE = {"log": {"progress": False, "writers": ["jsonl"]}, "optim": {"lr": 2e-3}, "eval": {"max_batches": 2}}


pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------- tiny data


@pytest.fixture(scope="module")
def vl(tmp_path_factory) -> Path:
    from foundation_tasks.vl_common.demo import write_dataset

    out = tmp_path_factory.mktemp("vl")
    write_dataset(out, seed=1, image_size=32, vqa_train=8, vqa_val=4, questions_per_image=2, nlvr2_train=4,
                  nlvr2_dev=4, text_lines=40)
    return out


@pytest.fixture(scope="module")
def vision(tmp_path_factory) -> Path:
    return write_vision_demo(tmp_path_factory.mktemp("vision"), train_per_class=4, val_per_class=2)


@pytest.fixture(scope="module")
def tokenizer(vision, tmp_path_factory) -> Path:
    """An (untrained) visual tokenizer checkpoint for MIM targets: 16 px images, 4 px patches."""
    cfg, specs = resolve({"backbone": {"dim": 16, "depth": 1, "heads": 2, "ffn_dim": 32},
                          "tasks": [{"name": "vq_tokenizer", "data_dir": str(vision), "img_size": 16, "patch_size": 4,
                                     "num_codes": 32, "code_dim": 8, "decoder_depth": 1}]}, check_data=False)
    torch.manual_seed(0)
    model = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))
    model.heads["vq_tokenizer"].quantize.initted.fill_(1)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.safetensors"
    checkpoint.save(model, path)
    return path


def crossmodal_tasks(best_rq: dict, vision: Path, vl: Path, tokenizer: Path) -> list[dict]:
    front = {"name": "vl_pretrain", "img_size": 32, "patch_size": 8, "max_text_len": 24, "text_positions": 32,
             "visual_vocab_size": 32, "visual_code_dim": 8}
    return [
        {"name": "mim", "data_dir": str(vision), "tokenizer": str(tokenizer), "img_size": 16, "patch_size": 4,
         "num_masking_patches": 6, "min_num_patches": 2, "scale": [0.5, 1.0]},
        {**front, "id": "text", "kind": "text", "train_data": str(vl / "text/train.txt"),
         "eval_data": str(vl / "text/val.txt")},
        {**front, "id": "image", "kind": "image", "train_data": str(vl / "vqa/train2014"),
         "eval_data": str(vl / "vqa/val2014")},
        {**front, "id": "pair", "kind": "pair", "train_data": str(vl / "coco/annotations/captions_train2014.json"),
         "train_images": str(vl / "vqa/train2014"), "eval_data": str(vl / "coco/annotations/captions_val2014.json"),
         "eval_images": str(vl / "vqa/val2014")},
        best_rq,
    ]


def build(backbone: dict, tasks: list[dict]) -> MultiTaskModel:
    cfg, specs = resolve({"backbone": backbone, "tasks": tasks}, check_data=False)
    torch.manual_seed(0)
    return MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))


def batch_of(model: MultiTaskModel, task_id: str, n: int = 4):
    task = model.tasks[task_id]
    data = task.train_dataset()
    return task.collate([data[i] for i in range(n)])


# ---------------------------------------------------------------------------- cross-modal


@pytest.fixture(scope="module")
def data(best_rq_spec, vision, vl, tokenizer):
    return best_rq_spec(batch_size=4), vision, vl, tokenizer


EXPERT_OF = {"mim": {"vision"}, "text": {"text"}, "image": {"vision"}, "pair": {"vision", "text"}, "speech": {"speech"}}


def expert_of(name: str) -> str | None:
    parts = name.split(".")
    return next((p for p in parts if p in EXPERTS), None)


@pytest.mark.parametrize("shared_attention", [True, False])
def test_a_step_of_one_modality_updates_its_expert_only(data, shared_attention):
    model = build({**BACKBONE, "experts": EXPERTS, "shared_attention": shared_attention}, crossmodal_tasks(*data))
    model.train()
    names = [n for n, _ in model.backbone.named_parameters()]
    shared = [n for n in names if expert_of(n) is None]
    assert any(".attn.qkv.weight" in n for n in shared) == shared_attention
    for tid, experts in EXPERT_OF.items():
        batch = batch_of(model, tid)
        before = {n: p.detach().clone() for n, p in model.backbone.named_parameters()}
        opt = build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.05))
        loss, _ = model(tid, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        changed = {n for n, p in model.backbone.named_parameters() if not torch.equal(p, before[n])}
        for n in names:
            e = expert_of(n)
            if e is not None and e not in experts:
                assert n not in changed, f"{tid} step changed {n}"
            elif e is not None or n in shared and "rel_pos" not in n:
                assert n in changed, f"{tid} step left {n} unchanged"


def test_fully_shared_backbone_trains_everything_from_every_modality(data):
    model = build({**BACKBONE, "experts": []}, crossmodal_tasks(*data))
    model.train()
    for tid in EXPERT_OF:
        before = {n: p.detach().clone() for n, p in model.backbone.named_parameters()}
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loss, _ = model(tid, batch_of(model, tid))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        unchanged = [n for n, p in model.backbone.named_parameters() if torch.equal(p, before[n])]
        assert unchanged == [], (tid, unchanged)


def test_crossmodal_run_then_fine_tune_plain_backbones(data, speech, tmp_path, capsys):
    _, vision, vl, _ = data
    backbone = {**BACKBONE, "experts": EXPERTS, "shared_attention": True}
    cfg = {**ENGINE, "run_name": "xm", "output_dir": str(tmp_path), "backbone": backbone,
           "tasks": crossmodal_tasks(*data), "train": {"steps": 2, "batch_size": 4, "mix": "sum"}}
    result = train(*resolve(cfg))
    assert result.status == "finished"
    assert {"mim/mim_acc", "pair/accuracy", "speech/accuracy"} <= result.metrics.keys()
    losses = [r for r in map(json.loads, (tmp_path / "xm/metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert set(EXPERT_OF) <= {k.split("/")[1] for k in losses[0] if k.startswith("loss/")}
    weights = tmp_path / "xm/best/model.safetensors"
    src = load_file(str(weights))
    capsys.readouterr()

    def plain(task: dict, **extra):
        cfg, specs = resolve({"backbone": BACKBONE, "tasks": [task], "init_from": str(weights), **extra},
                             check_data=False)
        model = build_model(cfg, specs)
        return model, capsys.readouterr().out

    # ASR (modality speech): the speech expert + the shared attention, and the VGG front end
    asr = {"name": "asr", "batch_size": 1, "data_dir": str(speech), "train_splits": ["train"], "eval_splits": ["dev"],
           "vocab_size": 19, "vgg_channels": [4, 8], "predictor_embed_dim": 8, "predictor_dim": 16, "joint_dim": 16,
           "aux_mlp_dim": 8}
    model, out = plain(asr)
    assert "the 'speech' expert into the plain layers" in out and "missing 0" in out
    bb = model.backbone.state_dict()
    for i in range(2):
        for name in ("mlp.fc1.weight", "mlp.fc2.bias", "norm2.weight", "attn.qkv.weight", "norm1.bias"):
            mod, rest = name.split(".", 1)
            theirs = f"backbone.encoder.layers.{i}.{mod}.speech.{rest}" if mod in ("mlp", "norm2") else \
                f"backbone.encoder.layers.{i}.{name}"
            assert torch.equal(bb[f"encoder.layers.{i}.{name}"], src[theirs]), name
    assert torch.equal(bb["encoder.norm.weight"], src["backbone.encoder.norm.speech.weight"])
    assert torch.equal(bb["encoder.rel_pos.table"], src["backbone.encoder.rel_pos.table"])
    head = model.heads["asr"].state_dict()
    assert all(torch.equal(head[k], src[f"heads.speech.{k}"]) for k in head if k.startswith("frontend."))

    # classification (modality vision): the vision expert; the MIM head's front end by name
    cls = {"name": "classification", "data_dir": str(vision), "num_classes": 3, "img_size": 16, "patch_size": 4}
    model, out = plain(cls)
    assert "the 'vision' expert into the plain layers" in out
    assert torch.equal(model.backbone.state_dict()["encoder.layers.1.mlp.fc1.weight"],
                       src["backbone.encoder.layers.1.mlp.vision.fc1.weight"])
    assert torch.equal(model.heads["classification"].patch_embed.proj.weight, src["heads.mim.patch_embed.proj.weight"])
    # init_expert overrides the tasks' modality
    model, out = plain(cls, init_expert="text")
    assert torch.equal(model.backbone.state_dict()["encoder.layers.0.mlp.fc1.weight"],
                       src["backbone.encoder.layers.0.mlp.text.fc1.weight"])

    # VQA (multiway vision + text, BEiT-3's layout): experts by name, the shared attention into both
    vqa = {"name": "vqa", "data_dir": str(vl / "vqa"), "img_size": 32, "patch_size": 8, "max_text_len": 24,
           "text_positions": 32, "min_answer_count": 1}
    cfg, specs = resolve({"backbone": {**BACKBONE, "experts": ["vision", "text"], "final_norm": False},
                          "tasks": [vqa], "init_from": str(weights)}, check_data=False)
    model = build_model(cfg, specs)
    out = capsys.readouterr().out
    assert "every expert (vision, text) from the shared layers" in out and "missing 0" in out
    bb = model.backbone.state_dict()
    for e in ("vision", "text"):
        layer = "encoder.layers.0"
        assert torch.equal(bb[f"{layer}.attn.qkv.{e}.weight"], src[f"backbone.{layer}.attn.qkv.weight"])
        assert torch.equal(bb[f"{layer}.mlp.{e}.fc1.weight"], src[f"backbone.{layer}.mlp.{e}.fc1.weight"])
    assert torch.equal(model.heads["vqa"].embed.text_embed.weight, src["heads.text.embed.text_embed.weight"])

    # what cannot be guessed or would silently mean something else is an error naming the fix
    with pytest.raises(ConfigError, match="init_expert"):
        plain(cls, init_expert="audio")
    cfg, specs = resolve({"backbone": BACKBONE, "tasks": [cls, asr]}, check_data=False)
    two = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))  # vision and speech: which expert?
    with pytest.raises(ConfigError, match="set init_expert to one of speech, text, vision"):
        load_init_from(two, weights)
    load_init_from(two, weights, expert="speech")
    with pytest.raises(ConfigError, match="backbone.heads=2"):
        resolve_and_build({"backbone": {**BACKBONE, "heads": 4}, "tasks": [cls], "init_from": str(weights)})


def resolve_and_build(raw: dict) -> MultiTaskModel:
    return build_model(*resolve(raw, check_data=False))


def test_adapt_state_between_layouts():
    value = lambda v: torch.full((1,), float(v))  # noqa: E731
    src = {"encoder.layers.0.mlp.vision.fc1.weight": value(0), "encoder.layers.0.mlp.speech.fc1.weight": value(1),
           "encoder.layers.0.mlp.vl.fc1.weight": value(2), "encoder.layers.0.attn.qkv.weight": value(3),
           "encoder.norm.speech.weight": value(4), "encoder.norm.vision.weight": value(5)}
    assert state_experts(src) == ["speech", "vision", "vl"]
    plain = ["encoder.layers.0.mlp.fc1.weight", "encoder.layers.0.attn.qkv.weight", "encoder.norm.weight"]
    out = adapt_state(src, plain, [], "speech")
    assert out.needs_expert and [float(out.state[k]) for k in plain] == [1.0, 3.0, 4.0]
    assert set(src) - out.used == {"encoder.layers.0.mlp.vision.fc1.weight", "encoder.layers.0.mlp.vl.fc1.weight",
                                   "encoder.norm.vision.weight"}
    assert adapt_state(src, plain, [], None).state.keys() == {"encoder.layers.0.attn.qkv.weight"}
    multi = ["encoder.layers.0.attn.qkv.vision.weight", "encoder.layers.0.attn.qkv.text.weight"]
    out = adapt_state(src, multi, ["vision", "text"])
    assert out.copied_shared and not out.needs_expert and all(float(out.state[k]) == 3.0 for k in multi)


@pytest.mark.parametrize("norm", ["magneto", "preln"])
def test_shipped_configs_resolve(norm):
    from foundation.engine.config import load_config

    cfg, specs = load_config(REPO / "configs/crossmodal/tiny.yaml", [f"backbone.norm={norm}"], check_data=False)
    assert cfg.backbone.norm == norm and cfg.run_name == f"crossmodal-tiny-{norm}"
    assert cfg.backbone.experts == EXPERTS and cfg.backbone.shared_attention and cfg.train.mix == "sum"
    assert [s.name for s in specs] == ["mim", "vl_pretrain", "best_rq"]
    assert {s.cls.modality for s in specs} == {"vision", None, "speech"}
    # the MIM target that pays where labels are scarce (needs no tokenizer); the VQA recipe's stem, so it loads there
    assert specs[0].config.target == "pixels" and specs[1].config.conv_stem
    # the VL entry is the pairs recipe that pays at 10 % of the questions, field for field
    _, pairs = load_config(REPO / "configs/vl/tiny_pretrain_pairs.yaml", [f"backbone.norm={norm}"], check_data=False)
    assert specs[1].config == pairs[0].config
    cfg, _ = load_config(REPO / "configs/crossmodal/tiny.yaml", [f"backbone.norm={norm}", "backbone.experts=[]", "backbone.shared_attention=false"], check_data=False)
    assert cfg.backbone.experts == []
    cfg, specs = load_config(REPO / "configs/best_rq/tiny.yaml", [f"backbone.norm={norm}"], check_data=False)
    asr, _ = load_config(REPO / "configs/asr/tiny.yaml", [f"backbone.norm={norm}"], check_data=False)
    assert cfg.backbone == asr.backbone and "init_embed_from" not in asr.tasks[0]  # init_from loads the front end
    for task in ("vqa", "nlvr2"):  # read raw: resolving them reads the data (the answer vocabulary)
        from omegaconf import OmegaConf

        raw = OmegaConf.load(REPO / f"configs/vl/tiny_{task}.yaml")
        assert raw.init_from is None and "pretrained" not in OmegaConf.to_container(raw)["tasks"][0]


def test_shared_attention_layout():
    from foundation import Backbone, BackboneConfig

    cfg = BackboneConfig(dim=16, depth=1, heads=2, ffn_dim=32, experts=["vision", "speech"], shared_attention=True)
    keys = set(Backbone(cfg).state_dict())
    assert {"encoder.layers.0.attn.qkv.weight", "encoder.layers.0.norm1.weight", "encoder.layers.0.attn.norm.weight",
            "encoder.layers.0.mlp.speech.fc1.weight", "encoder.layers.0.norm2.vision.weight"} <= keys
    assert not any(".attn.qkv.vision" in k for k in keys)
    with pytest.raises(ValueError, match="shared_attention"):
        checkpoint.torchscale_args(cfg.replace(experts=["vision", "text"]))
