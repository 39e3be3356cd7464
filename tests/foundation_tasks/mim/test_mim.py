"""MIM on tiny data: the loss drops on a fixed batch; MIM weights into the classifier (only the
head missing), fine-tuning with layer decay; config errors; the MIM-vs-scratch comparison."""
from __future__ import annotations

import warnings

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from foundation.config import ConfigError
from foundation.engine.config import resolve
from foundation.engine.loop import train
from foundation.engine.model import ModelConfig, MultiTaskModel
from foundation.engine.optim import layer_ids, param_groups
from support import load_benchmark, overfit_losses

IMAGE = {"img_size": 16, "patch_size": 4}


pytestmark = pytest.mark.usefixtures("one_thread")


def test_mim_loss_drops_on_a_fixed_batch(tmp_path, mim_task, vision_config):
    cfg, specs = resolve(OmegaConf.create(vision_config(tmp_path, "mim", mim_task)))
    torch.manual_seed(0)
    model = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))
    task = model.tasks["mim"]
    ds = task.train_dataset()
    batch = task.collate([ds[i] for i in range(8)])
    assert batch["mask"].shape == (8, 16) and (batch["mask"].sum(1) <= 6).all() and batch["mask"].sum() >= 40
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    losses, logs = overfit_losses(model, "mim", batch, opt, 25)
    assert losses[-1] < 0.5 * losses[0], losses
    assert 0 <= float(logs["mim_acc"]) <= 1
    # the tokenizer is neither trained nor saved with the MIM weights
    assert not any("tokenizer" in k for k in model.state_dict())


def test_mim_then_finetune_loads_everything_but_the_head(vision_data, tmp_path, capsys, mim_task, vision_config, run_config):
    mim = run_config(vision_config(tmp_path, "mim", mim_task))
    assert mim.status == "finished" and 0 <= mim.metrics["mim/mim_acc"] <= 1
    pretrained = mim.run_dir / "best" / "model.safetensors"
    source = load_file(str(pretrained))

    task = {"name": "classification", "data_dir": str(vision_data), "num_classes": 3, **IMAGE, "scale": [0.5, 1.0],
            "crop_pct": 1.0}
    ft = vision_config(tmp_path, "ft", task, init_from=str(pretrained),
                optim={"lr": 1e-3, "layer_decay": 0.65}, train={"steps": 2, "batch_size": 8})
    cfg, specs = resolve(OmegaConf.create(ft))
    capsys.readouterr()
    from foundation.engine.loop import build_model

    with warnings.catch_warnings():  # reading the MIM file (its tokenizer built on the meta device) warns nothing
        warnings.simplefilter("error")
        model = build_model(cfg, specs)
    printed = capsys.readouterr().out
    # the backbone and, by name, the front end through the engine's init_from
    assert "missing 0" in printed and "unexpected 0" in printed
    for k, v in model.backbone.state_dict().items():
        assert torch.equal(v, source[f"backbone.{k}"]), k
    head = model.heads["classification"]
    from foundation.engine.init import load_init_from

    report = load_init_from(model, pretrained, log=lambda s: None)
    assert sorted(report.kept) == [f"heads.classification.{k}" for k in ("fc_norm.bias", "fc_norm.weight",
                                                                        "head.bias", "head.weight")]
    assert sorted(report.unused) == ["heads.mim.lm_head.bias", "heads.mim.lm_head.weight", "heads.mim.mask_token"]
    for k in ("patch_embed.proj.weight", "patch_embed.proj.bias", "cls_token", "pos_embed"):
        assert torch.equal(head.state_dict()[k], source[f"heads.mim.{k}"]), k
    # layer decay: the front end sits with the embeddings (layer 0), the head on top
    ids, depth = layer_ids(model)
    assert ids["heads.classification.pos_embed"] == 0 and ids["heads.classification.head.weight"] == depth + 1
    groups = {g["layer_id"]: g["lr"] for g in param_groups(model, cfg.optim)}
    assert groups[0] == pytest.approx(1e-3 * 0.65 ** (depth + 1)) and groups[depth + 1] == pytest.approx(1e-3)

    result = train(cfg, specs)
    assert result.status == "finished"
    # the fine-tuned classifier is a timm-style VisionTransformer computing the same logits
    from foundation import checkpoint
    from foundation_tasks.classification.model import to_vit

    trained = checkpoint.load(result.run_dir / "best" / "model.safetensors").eval()
    vit = to_vit(trained).eval()
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(vit(x), trained.heads["classification"].logits(trained.backbone, x))
    assert set(result.metrics) == {"classification/top1", "classification/top5", "classification/loss"}
    assert result.metrics["classification/top5"] == 1.0  # 3 classes: top-5 is everything
    # from scratch: the same config without init_from
    scratch = run_config(ft, "init_from=null", "run_name=scratch")
    assert scratch.status == "finished"


def test_mim_config_errors_name_the_field(tmp_path, mim_task, vision_config):
    with pytest.raises(ConfigError, match="field 'tokenizer': not found"):
        resolve(OmegaConf.create(vision_config(tmp_path, "mim", {**mim_task, "tokenizer": "nope"})))
    with pytest.raises(ConfigError, match="tokenizer.*encodes 16px images in 4px patches"):
        bad = {**mim_task, "img_size": 32, "num_masking_patches": 20}
        cfg, specs = resolve(OmegaConf.create(vision_config(tmp_path, "mim", bad)))
        MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))
    with pytest.raises(ConfigError, match="masking: num_masking_patches must be in"):
        resolve(OmegaConf.create(vision_config(tmp_path, "mim", {**mim_task, "num_masking_patches": 17})))


def test_mim_pos_embed_init_sincos(tmp_path, mim_task, vision_config):
    """MIM can start its positions as the fine-tuning recipe does (the 2-D sin-cos table), so the
    positions a fine-tuning loads from it are not the 0.02 start that MIM barely moves."""
    from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed

    cfg, specs = resolve(OmegaConf.create(vision_config(tmp_path, "mim", {**mim_task, "pos_embed_init": "sincos"})))
    head = specs[0].task(cfg.backbone).build_head()
    grid = [mim_task["img_size"] // mim_task["patch_size"]] * 2
    assert torch.allclose(head.pos_embed[0, 1:], build_sincos2d_pos_embed(grid, cfg.backbone.dim))
    with pytest.raises(ConfigError, match="field 'pos_embed_init': must be one of trunc_normal, sincos"):
        resolve(OmegaConf.create(vision_config(tmp_path, "mim", {**mim_task, "pos_embed_init": "zeros"})))


def test_mim_targets_benchmark_reads_the_tokens(vision_data, vision_tokenizer, capsys):
    """benchmarks/mim_targets.py on a tiny tokenizer: code usage, colour R^2 and the three probes."""
    module = load_benchmark("mim_targets")
    assert module.main([str(vision_tokenizer), "--data", str(vision_data)]) == 0
    out = capsys.readouterr().out
    assert "of 64, perplexity" in out and "val R^2" in out and "chance 33.3" in out
    scores = [float(line.rsplit(":", 1)[1]) for line in out.splitlines() if line.startswith("  ")]
    assert len(scores) == 3 and all(0 <= s <= 100 for s in scores)
    assert module.main([str(vision_tokenizer), "--data", "/no/such/folder"]) == 2  # one line, no traceback
    assert "no such folder" in capsys.readouterr().err
