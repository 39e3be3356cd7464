"""The pixel target of the MIM task (SimMIM's masking, MAE's normalised-pixel loss): targets
checked by hand, the loss drops on a fixed batch, a run picks best/ by the lowest pixel loss,
and fine-tuning loads its front end and backbone; label budgets for fine-tuning."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from foundation.config import ConfigError
from foundation.engine.config import best_metric, resolve
from foundation.engine.model import ModelConfig, MultiTaskModel
from foundation_tasks.vision_common.pixels import patchify
from support import overfit_losses

IMAGE = {"img_size": 16, "patch_size": 4}
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def pixel_task(vision_data):
    return {"name": "mim", "data_dir": str(vision_data), "target": "pixels", **IMAGE, "num_masking_patches": 6,
            "min_num_patches": 2, "scale": [0.5, 1.0]}


def test_patchify_and_normalised_targets_by_hand():
    images = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).reshape(2, 3, 8, 8)
    p = patchify(images, 4)
    assert p.shape == (2, 4, 48)
    # patch 1 of image 0 is rows 0-3, columns 4-7; values ordered (row, column, channel) as MAE's
    want = images[0, :, 0:4, 4:8].permute(1, 2, 0).reshape(-1)
    assert torch.equal(p[0, 1], want)
    from foundation_tasks.mim.model import PixelMIMHead

    head = PixelMIMHead(16, 8, 4)
    t = head.targets(images)
    assert torch.allclose(t.mean(-1), torch.zeros(2, 4), atol=1e-5)
    assert torch.allclose(t.var(-1), torch.ones(2, 4), atol=1e-3)
    assert torch.equal(PixelMIMHead(16, 8, 4, norm_pix=False).targets(images), p)


def test_pixel_mim_learns_and_needs_no_tokenizer(tmp_path, pixel_task, vision_config):
    cfg, specs = resolve(OmegaConf.create(vision_config(tmp_path, "pix", pixel_task)))
    assert best_metric(cfg, specs) == ("mim/pix_loss", False)  # lower is better
    torch.manual_seed(0)
    model = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))
    task = model.tasks["mim"]
    ds = task.train_dataset()
    batch = task.collate([ds[i] for i in range(8)])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses, _ = overfit_losses(model, "mim", batch, opt, 30)
    assert losses[0] > 0.7 and losses[-1] < 0.6 * losses[0], losses
    assert {k.split(".")[2] for k in model.state_dict() if k.startswith("heads.mim.")} >= {"pixel_head", "mask_token"}
    with pytest.raises(ConfigError, match="field 'target': must be one of tokens, pixels"):
        resolve(OmegaConf.create(vision_config(tmp_path, "bad", {**pixel_task, "target": "depth"})))


def test_pixel_mim_run_then_finetune_from_it_at_a_label_budget(tmp_path, pixel_task, vision_data, vision_config,
                                                               run_config):
    mim = run_config(vision_config(tmp_path, "pix", pixel_task, train={"steps": 4, "batch_size": 8}))
    assert mim.status == "finished" and 0 < mim.metrics["mim/pix_loss"] < 2
    from foundation.engine.init import load_init_from
    from foundation.engine.loop import build_model

    task = {"name": "classification", "data_dir": str(vision_data), "num_classes": 3, **IMAGE, "crop_pct": 1.0,
            "train_per_class": 2, "subset_seed": 1, "pos_embed_init": "sincos", "mixup": 0.0, "cutmix": 0.0}
    weights = mim.run_dir / "best" / "model.safetensors"
    cfg, specs = resolve(OmegaConf.create(vision_config(tmp_path, "ft", task, init_from=str(weights))))
    model = build_model(cfg, specs)
    report = load_init_from(model, weights, log=lambda s: None)
    assert sorted(report.unused) == ["heads.mim.mask_token", "heads.mim.pixel_head.bias",
                                     "heads.mim.pixel_head.weight"]
    c = model.tasks["classification"]
    assert len(c.train_dataset()) == 6 and len(c.eval_dataset()) == 12  # 2 per class; val untouched


def test_label_subsets_are_seeded_nested_and_leave_val_alone(vision_data, tmp_path):
    from foundation_tasks.vision_common.folder import ImageFolderDataset, labelled_subset
    from foundation_tasks.vision_common.images import ImageDataError

    full = ImageFolderDataset(vision_data, "train", lambda im: im)
    samples = full.samples
    two = labelled_subset(samples, 2, seed=0)
    assert [y for _, y in two] == [0, 0, 1, 1, 2, 2]
    assert two == labelled_subset(samples, 2, seed=0)  # the same seed, the same images
    assert two != labelled_subset(samples, 2, seed=1)
    assert set(two) <= set(labelled_subset(samples, 5, seed=0))  # budgets are nested
    with pytest.raises(ImageDataError, match="class 0 has 8 images, fewer than the 9 per class"):
        labelled_subset(samples, 9, seed=0)
    sub = ImageFolderDataset(vision_data, "train", lambda im: im, per_class=2, subset_seed=0)
    assert sub.samples == two
