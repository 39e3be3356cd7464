"""``init_from``, the one way to start from a file (foundation/engine/init.py): the backbone
and every head tensor whose name matches, resized or skipped through ``Task.adapt_init``,
with one summary line; and modules the VL heads share through the engine's registry."""
import pytest
import torch
from safetensors.torch import save_file

from foundation.config import BackboneConfig, ConfigError
from foundation.engine.init import load_init_from
from foundation.engine.model import ModelConfig, MultiTaskModel
from foundation.engine.task import SharedModules

PLAIN = {"dim": 16, "depth": 2, "heads": 2, "ffn_dim": 32}
VL = {**PLAIN, "experts": ["vision", "text"]}
FRONT = {"img_size": 32, "patch_size": 8, "max_text_len": 24, "text_positions": 32}


def build(backbone: dict, tasks: list[dict], seed: int = 0) -> MultiTaskModel:
    torch.manual_seed(seed)
    return MultiTaskModel(ModelConfig(BackboneConfig(**backbone), tasks))


def save(model: MultiTaskModel, path) -> None:
    """A run's tensors (without the data-derived metadata a real run also stores)."""
    save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, str(path))


def classification(**extra) -> dict:
    return {"name": "classification", "num_classes": 3, "img_size": 16, "patch_size": 4, **extra}


def mim_like(path, backbone: MultiTaskModel, grid: int, seed: int = 1) -> dict:
    """A MIM run's tensors: the backbone and heads.mim.{patch_embed, cls_token, pos_embed,
    mask_token, lm_head} (no stored config: nothing to compare)."""
    g = torch.Generator().manual_seed(seed)
    state = {f"backbone.{k}": torch.randn(v.shape, generator=g) for k, v in backbone.backbone.state_dict().items()}
    state.update({"heads.mim.patch_embed.proj.weight": torch.randn(16, 3, 4, 4, generator=g),
                  "heads.mim.patch_embed.proj.bias": torch.randn(16, generator=g),
                  "heads.mim.cls_token": torch.randn(1, 1, 16, generator=g),
                  "heads.mim.pos_embed": torch.randn(1, 1 + grid * grid, 16, generator=g),
                  "heads.mim.mask_token": torch.randn(1, 1, 16, generator=g),
                  "heads.mim.lm_head.weight": torch.randn(7, 16, generator=g)})
    save_file(state, str(path))
    return state


def test_mim_run_into_classification_resizes_positions_and_logs_one_summary(tmp_path):
    model = build(PLAIN, [classification(img_size=24)])  # a 6x6 grid; the file's is 4x4
    src = mim_like(tmp_path / "mim.safetensors", model, grid=4)
    lines = []
    report = load_init_from(model, tmp_path / "mim.safetensors", log=lines.append)
    head = model.heads["classification"]
    for k in ("patch_embed.proj.weight", "patch_embed.proj.bias", "cls_token"):
        assert torch.equal(head.state_dict()[k], src[f"heads.mim.{k}"]), k
    assert head.pos_embed.shape == (1, 37, 16) and torch.equal(head.pos_embed[:, 0], src["heads.mim.pos_embed"][:, 0])
    assert report.resized == {"heads.classification.pos_embed": "1x17x16 -> 1x37x16"}
    assert sorted(report.kept) == [f"heads.classification.{k}" for k in ("fc_norm.bias", "fc_norm.weight",
                                                                        "head.bias", "head.weight")]
    assert sorted(report.unused) == ["heads.mim.lm_head.weight", "heads.mim.mask_token"]
    assert not report.missing and not report.unexpected and not report.skipped
    for k, v in model.backbone.state_dict().items():
        assert torch.equal(v, src[f"backbone.{k}"]), k
    assert len(lines) == 1 and lines[0].startswith(f"init_from {tmp_path / 'mim.safetensors'}: loaded ")
    assert "resized 1: heads.classification.pos_embed 1x17x16 -> 1x37x16" in lines[0] and "missing 0" in lines[0]


def test_a_classifier_of_another_size_is_skipped_not_an_error(tmp_path):
    five = build(PLAIN, [classification(num_classes=5)], seed=1)
    save(five, tmp_path / "five.safetensors")
    three = build(PLAIN, [classification()])
    report = load_init_from(three, tmp_path / "five.safetensors", log=lambda s: None)
    assert report.skipped == {"heads.classification.head.weight": "5x16 here, 3x16 in the model",
                              "heads.classification.head.bias": "5 here, 3 in the model"}
    same = five.heads["classification"].state_dict()
    for k, v in three.heads["classification"].state_dict().items():
        if not k.startswith("head."):
            assert torch.equal(v, same[k]), k  # fc_norm too: every tensor whose name and shape fit


def test_a_file_with_nothing_for_this_model_is_an_error(tmp_path):
    """A file none of whose tensors this model takes would start the run from scratch
    unannounced: one line naming the field, the file and what it holds instead."""
    save_file({"heads.image.embed.cls_token": torch.zeros(1, 1, 16), "encoder.weight": torch.zeros(3)},
              str(tmp_path / "other.safetensors"))
    with pytest.raises(ConfigError, match=r"field 'init_from': .*other\.safetensors: none of its 2 tensors "
                                          r"\(encoder\.weight, heads\.image\.embed\.cls_token\)"):
        load_init_from(build(PLAIN, [classification()]), tmp_path / "other.safetensors", log=lambda s: None)


def test_relative_position_table_resized_through_the_task_hook(tmp_path):
    rel = {**PLAIN, "rel_pos": "2d", "rel_pos_prefix": 1}
    small = build({**rel, "rel_pos_grid": [4, 4]}, [classification()], seed=1)
    with torch.no_grad():
        small.backbone.encoder.rel_pos.table.normal_()
    save(small, tmp_path / "small.safetensors")
    big = build({**rel, "rel_pos_grid": [6, 6]}, [classification(img_size=24)])
    report = load_init_from(big, tmp_path / "small.safetensors", log=lambda s: None)
    assert report.resized["backbone.encoder.rel_pos.table"] == "52x2 -> 124x2"
    centre = lambda t, g: t[(g - 1) * (2 * g - 1) + (g - 1)]  # noqa: E731  offset (0, 0)
    torch.testing.assert_close(centre(big.backbone.encoder.rel_pos.table, 6),
                               centre(small.backbone.encoder.rel_pos.table, 4))


def test_best_rq_run_into_asr_loads_the_front_end_only(tmp_path):
    speech = {"data_dir": str(tmp_path / "none"), "train_splits": ["train"], "eval_splits": ["dev"],
              "vgg_channels": [4, 8]}
    brq = build(PLAIN, [{"name": "best_rq", **speech, "codebook_size": 32, "codebook_dim": 8}], seed=1)
    with torch.no_grad():
        brq.heads["best_rq"].cmvn.mean.fill_(3.0)
    save(brq, tmp_path / "brq.safetensors")
    asr = build(PLAIN, [{"name": "asr", "batch_size": 1, **speech, "vocab_size": 19, "predictor_embed_dim": 8,
                         "predictor_dim": 16, "joint_dim": 16, "aux_mlp_dim": 8}])
    lines = []
    report = load_init_from(asr, tmp_path / "brq.safetensors", log=lines.append)
    theirs, ours = brq.heads["best_rq"].state_dict(), asr.heads["asr"].state_dict()
    front = sorted(k for k in ours if k.startswith("frontend."))
    assert front and all(torch.equal(ours[k], theirs[k]) for k in front)
    assert sorted(k for k in report.loaded if k.startswith("heads.")) == [f"heads.asr.{k}" for k in front]
    assert not torch.equal(ours["cmvn.mean"], theirs["cmvn.mean"])  # this task's own statistics
    assert set(report.skipped) == {f"heads.asr.cmvn.{k}" for k in ("frames", "mean", "std")}
    assert {"heads.best_rq.out.weight", "heads.best_rq.quantizer.codebook"} <= set(report.unused)
    assert "skipped 3" in lines[0]
    # optim.freeze_pretrained_steps holds exactly what was loaded: the encoder and its front end,
    # while the predictor, joint network and CTC layer train
    from foundation.engine.config import OptimConfig
    from foundation.engine.optim import param_groups

    names = {id(p): n for n, p in asr.named_parameters()}
    groups = param_groups(asr, OptimConfig(freeze_pretrained_steps=5), set(report.loaded))
    held = {names[id(p)] for g in groups if g.get("frozen_steps") == 5 for p in g["params"]}
    assert held == {n for n in names.values() if n.startswith(("backbone.", "heads.asr.frontend."))}
    assert any(n.startswith("heads.asr.predictor") for n in set(names.values()) - held)


def test_vl_pretraining_run_into_vqa_loads_the_shared_embedding(tmp_path):
    pre = build(VL, [{"name": "vl_pretrain", "id": "text", "kind": "text", **FRONT},
                     {"name": "vl_pretrain", "id": "pair", "kind": "pair", **FRONT, "visual_vocab_size": 32,
                      "visual_code_dim": 8}], seed=1)
    assert pre.heads["text"].embed is pre.heads["pair"].embed  # one embedding through the engine's registry
    save(pre, tmp_path / "pre.safetensors")
    vqa = build(VL, [{"name": "vqa", "answers": ["yes", "no"], **FRONT, "img_size": 48}])  # 6x6 patches, not 4x4
    report = load_init_from(vqa, tmp_path / "pre.safetensors", log=lambda s: None)
    theirs, ours = pre.heads["text"].embed.state_dict(), vqa.heads["vqa"].embed.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours if k != "vision_pos")
    assert report.resized == {"heads.vqa.embed.vision_pos": "17x16 -> 37x16"}
    assert torch.equal(ours["vision_pos"][0], theirs["vision_pos"][0])
    assert not any(k.startswith(("heads.vqa.pooler", "heads.vqa.head")) for k in report.loaded)
    for k, v in vqa.backbone.state_dict().items():
        assert torch.equal(v, pre.backbone.state_dict()[k]), k


def test_two_vl_tasks_share_one_embedding_per_model():
    tasks = [{"name": "vqa", "answers": ["yes", "no"], **FRONT}, {"name": "nlvr2", **FRONT}]
    one, two = build(VL, tasks), build(VL, tasks)
    assert one.heads["vqa"].embed is one.heads["nlvr2"].embed
    assert one.heads["vqa"].embed is not two.heads["vqa"].embed  # per model, not per config object
    # parts no head uses are frozen (DDP refuses parameters without gradients)
    assert not one.heads["vqa"].embed.mask_token.requires_grad
    with pytest.raises(ConfigError, match="share the BEiT-3 embedding.*img_size: 48 here, 32 in vqa"):
        build(VL, [tasks[0], {**tasks[1], "img_size": 48}])


def test_shared_modules_registry():
    shared = SharedModules()
    made = []
    make = lambda: made.append(1) or torch.nn.Linear(2, 2)  # noqa: E731
    a = shared.get_or_create("proj", {"dim": 2}, make, owner="a")
    assert shared.get_or_create("proj", {"dim": 2}, make, owner="b") is a and len(made) == 1
    with pytest.raises(ConfigError, match="dim: 3 here, 2 in a"):
        shared.get_or_create("proj", {"dim": 3}, make, owner="c")


def test_heads_that_disagree_on_a_tensor_are_skipped_saying_so(tmp_path):
    model = build(PLAIN, [classification()])
    before = model.heads["classification"].cls_token.detach().clone()
    state = {f"backbone.{k}": v for k, v in model.backbone.state_dict().items()}
    state.update({"heads.a.cls_token": torch.zeros(1, 1, 16), "heads.b.cls_token": torch.ones(1, 1, 16)})
    save_file(state, str(tmp_path / "two.safetensors"))
    lines = []
    report = load_init_from(model, tmp_path / "two.safetensors", log=lines.append)
    assert report.skipped == {"heads.classification.cls_token": "heads a, b of the file hold different values"}
    assert torch.equal(model.heads["classification"].cls_token, before) and not report.unused
    assert "skipped 1: heads.classification.cls_token (heads a, b of the file hold different values)" in lines[0]
