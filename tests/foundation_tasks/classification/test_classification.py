"""Image classification on tiny data: timm's transforms, Mixup, the sin-cos position start, the
tiny recipe, config errors; the shipped vision configs (tokenizer, MIM, fine-tuning) are valid."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from foundation.config import ConfigError
from foundation.engine.config import load_config, resolve
from foundation.engine.model import ModelConfig, MultiTaskModel

REPO = Path(__file__).resolve().parents[3]
IMAGE = {"img_size": 16, "patch_size": 4}


pytestmark = pytest.mark.usefixtures("one_thread")


def test_classification_pipeline_is_timms(vision_data, tmp_path, vision_config):
    task = {"name": "classification", "data_dir": str(vision_data), "num_classes": 3, **IMAGE}
    cfg, specs = resolve(OmegaConf.create(vision_config(tmp_path, "ft", task)))
    t = specs[0].task(cfg.backbone)
    names = [type(x).__name__ for x in t.train_dataset().transform.transforms]
    assert names[0] == "RandomResizedCropAndInterpolation" and "RandAugment" in names and names[-1] == "RandomErasing"
    ra = next(x for x in t.train_dataset().transform.transforms if type(x).__name__ == "RandAugment")
    assert ra.num_layers == 2 and ra.ops[0].magnitude == 9  # rand-m9-mstd0.5-inc1
    assert t.train_dataset().transform.transforms[-1].probability == 0.25
    mixup = t.mixup()
    assert (mixup.mixup_alpha, mixup.cutmix_alpha, mixup.label_smoothing) == (0.8, 1.0, 0.1)
    head = t.build_head()
    backbone = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs)).backbone
    with pytest.raises(ValueError, match="batch size must be even"):
        head(backbone, {"images": torch.randn(3, 3, 16, 16), "labels": torch.tensor([0, 1, 2])})
    loss, _ = head(backbone, {"images": torch.randn(4, 3, 16, 16), "labels": torch.tensor([0, 1, 2, 0])})
    assert loss.ndim == 0 and torch.isfinite(loss)


def test_pos_embed_init_sincos_starts_from_the_2d_table(vision_data, tmp_path, vision_config):
    from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed

    task = {"name": "classification", "data_dir": str(vision_data), "num_classes": 3, **IMAGE, "pos_embed_init": "sincos"}
    cfg, specs = resolve(OmegaConf.create(vision_config(tmp_path, "ft", task)))
    head = specs[0].task(cfg.backbone).build_head()
    assert torch.allclose(head.pos_embed[0, 1:], build_sincos2d_pos_embed([4, 4], 32))
    assert head.pos_embed[0, 0].abs().max() < 0.1 and head.pos_embed.requires_grad  # class token row: 0.02 start
    with pytest.raises(ConfigError, match="field 'pos_embed_init': must be one of trunc_normal, sincos"):
        resolve(OmegaConf.create(vision_config(tmp_path, "ft", {**task, "pos_embed_init": "zeros"})))


def test_tiny_recipe_keeps_the_whole_object(vision_data):
    """The demo objects fill the frame: the tiny recipe's training transform only flips
    (a RandomResizedCrop of half the area cuts the silhouette, i.e. the label)."""
    cfg, specs = load_config(REPO / "configs" / "vision" / "tiny_finetune.yaml",
                             ["init_from=null", f"tasks.classification.data_dir={vision_data}",
                              "tasks.classification.img_size=16", "tasks.classification.num_classes=3"])
    dataset = specs[0].task(cfg.backbone).train_dataset()
    image = dataset.load(0)[0].resize((16, 16))
    x = dataset.transform(image)
    ref = dataset.transform.transforms[-1](dataset.transform.transforms[-2](image))  # ToTensor, Normalize only
    assert torch.allclose(x, ref, atol=1e-6) or torch.allclose(x, ref.flip(-1), atol=1e-6)
    assert specs[0].task(cfg.backbone).mixup() is None and cfg.optim.layer_decay is None


def test_classification_config_errors_name_the_field(vision_data, tmp_path, vision_config):
    task = {"name": "classification", "data_dir": str(vision_data), "num_classes": 5, **IMAGE}
    with pytest.raises(ConfigError, match="field 'num_classes': 5, but .* has 3 class folders"):
        resolve(OmegaConf.create(vision_config(tmp_path, "ft", task)))


@pytest.mark.parametrize("norm", ["magneto", "preln"])
@pytest.mark.parametrize("name", ["tiny_tokenizer", "tiny_mim", "tiny_finetune", "base_mim", "large_mim",
                                  "base_finetune", "large_finetune", "base_tokenizer"])
def test_shipped_configs_are_valid(name, norm):
    cfg, specs = load_config(REPO / "configs" / "vision" / f"{name}.yaml", ["init_from=null", f"backbone.norm={norm}"],
                             check_data=False)
    assert cfg.backbone.norm == norm and (norm in cfg.run_name or "tokenizer" in name)
    assert cfg.backbone.ffn_dim == 4 * cfg.backbone.dim  # spelled out: the engine's default is 3072
    if name.startswith(("base", "large")):
        large = name.startswith("large")
        assert (cfg.backbone.dim, cfg.backbone.depth) == ((1024, 24) if large else (768, 12))
        if "finetune" in name:  # Magneto Table 14
            assert cfg.optim.layer_decay == (0.8 if large else 0.65)
            assert cfg.backbone.drop_path == (0.2 if large else 0.1)
            assert cfg.optim.lr == (3e-4 if large else 5e-4)
        if "mim" in name:  # Magneto Table 13
            assert cfg.optim.betas == [0.9, 0.98] and cfg.optim.lr == 1.5e-3 and cfg.optim.clip_grad == 3.0
            assert cfg.optim.weight_decay == 0.05 and cfg.schedule.name == "cosine" and cfg.schedule.min_lr == 1e-5
