"""Segmentation in the engine, and pretrained weights into it: position tables resized
(checked by hand), MIM / ViT checkpoints into the engine model and MagnetoViT, a short
`foundation train` run with sliding-window evaluation. CPU, tiny."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from foundation import checkpoint
from foundation.checkpoint import CheckpointError
from foundation.config import BackboneConfig, ConfigError, to_dict
from foundation.engine.config import resolve
from foundation.engine.loop import build_model, train
from foundation.layers import RelativePositionBias2d
from foundation.transformer import Backbone
from foundation.vit import VisionTransformer, ViTConfig
from foundation_tasks.segmentation import demo
from foundation_tasks.segmentation.mmseg_backbone import MagnetoViT
from foundation_tasks.segmentation.pretrained import load_vit_weights, main as convert_main, resize_pos_embed, resize_rel_pos_table


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def ade_tree(write_ade_tree) -> Path:
    return write_ade_tree(n_train=8, n_val=2, height=24, width=32)


# --------------------------------------------------------------------------- position tables


def offsets_table(h: int, w: int, fn) -> torch.Tensor:
    """A RelativePositionBias2d table whose offset rows hold fn(dy, dx), extras 100, 101, 102."""
    rows = [fn(dy, dx) for dy in range(-(h - 1), h) for dx in range(-(w - 1), w)]
    table = torch.tensor(rows + [100.0, 101.0, 102.0])[:, None]
    return torch.cat([table, -table], 1)  # two heads


def test_rel_pos_table_same_grid_is_identity():
    t = torch.randn(7 * 7 + 3, 4)
    assert resize_rel_pos_table(t, (4, 4), (4, 4)) is t
    with pytest.raises(ValueError, match="do not fit a 5x5 grid"):
        resize_rel_pos_table(t, (5, 5), (8, 8))


def test_rel_pos_table_known_patterns():
    h, H = 7, 20  # e.g. 112 -> 320 pixels at patch 16
    new = resize_rel_pos_table(offsets_table(h, h, lambda dy, dx: 5.0), (h, h), (H, H))
    assert new.shape == ((2 * H - 1) ** 2 + 3, 2)
    torch.testing.assert_close(new[:-3], torch.full_like(new[:-3], 5.0).mul(torch.tensor([1.0, -1.0])))
    torch.testing.assert_close(new[-3:, 0], torch.tensor([100.0, 101.0, 102.0]))  # class-token entries kept
    # a bias that grows with |dx| only: BEiT's geometric resampling keeps offsets 0 and +-1
    # exactly, stretches the largest old offset (6) to the largest new one (19), is monotone
    # in between and does not depend on dy
    new = resize_rel_pos_table(offsets_table(h, h, lambda dy, dx: float(abs(dx))), (h, h), (H, H))[:-3, 0]
    grid = new.view(2 * H - 1, 2 * H - 1)  # [dy + H - 1, dx + H - 1]
    torch.testing.assert_close(grid, grid[:1].expand_as(grid))
    row = grid[0]
    c = H - 1
    assert row[c].item() == pytest.approx(0.0, abs=1e-5)
    assert row[c + 1].item() == pytest.approx(1.0, abs=1e-5) and row[c - 1].item() == pytest.approx(1.0, abs=1e-5)
    assert row[-1].item() == pytest.approx(6.0, abs=1e-3) and row[0].item() == pytest.approx(6.0, abs=1e-3)
    assert bool((row[c:].diff() >= -1e-6).all())
    # in the model: the bias between two patches one step apart is the old one
    bias = RelativePositionBias2d(2, (H, H), prefix=1)
    with torch.no_grad():
        bias.table.copy_(resize_rel_pos_table(offsets_table(h, h, lambda dy, dx: float(abs(dx))), (h, h), (H, H)))
    b = bias(H * H + 1)[0, 0]
    assert b[1, 2].item() == pytest.approx(1.0, abs=1e-5) and b[0, 5].item() == 100.0


def test_pos_embed_resize():
    pos = torch.randn(1, 1 + 16, 8)
    assert resize_pos_embed(pos, (4, 4)) is pos
    big = resize_pos_embed(pos, (8, 8))
    assert big.shape == (1, 65, 8)
    torch.testing.assert_close(big[:, 0], pos[:, 0])  # the class token's entry is kept
    flat = resize_pos_embed(torch.ones(1, 17, 8), (6, 6))
    torch.testing.assert_close(flat, torch.ones(1, 37, 8))


# --------------------------------------------------------------------------- pretrained


def tiny_backbone(**kw) -> dict:
    return dict(dim=32, depth=2, heads=2, ffn_dim=64, **kw)


def mim_like_checkpoint(path: Path, grid: int = 4, rel_pos: bool = True, norm: str = "magneto") -> dict:
    """A MultiTaskModel file as a MIM run writes it: backbone.* plus heads.mim.{front end,
    mask_token, lm_head}, with the model config in the metadata."""
    bcfg = BackboneConfig(**tiny_backbone(norm=norm, rel_pos="2d" if rel_pos else "none",
                                          rel_pos_grid=[grid, grid] if rel_pos else None))
    torch.manual_seed(1)
    bb = Backbone(bcfg)
    with torch.no_grad():
        if rel_pos:
            bb.encoder.rel_pos.table.normal_()
    state = {f"backbone.{k}": v for k, v in bb.state_dict().items()}
    state.update({
        "heads.mim.patch_embed.proj.weight": torch.randn(32, 3, 4, 4), "heads.mim.patch_embed.proj.bias": torch.randn(32),
        "heads.mim.cls_token": torch.randn(1, 1, 32), "heads.mim.pos_embed": torch.randn(1, 1 + grid * grid, 32),
        "heads.mim.mask_token": torch.randn(1, 1, 32), "heads.mim.lm_head.weight": torch.randn(16, 32),
    })
    meta = {"foundation.format": "1", "foundation.kind": "MultiTaskModel",
            "foundation.config": json.dumps({"backbone": to_dict(bcfg), "tasks": [{"name": "mim", "id": "mim"}]})}
    save_file(state, str(path), metadata=meta)
    return state


def test_mim_checkpoint_into_magneto_vit_at_a_larger_resolution(tmp_path):
    src = mim_like_checkpoint(tmp_path / "mim.safetensors", grid=4)
    vit = MagnetoViT(img_size=32, patch_size=4, embed_dims=32, num_layers=2, num_heads=2, mlp_ratio=2,
                     out_indices=(0, 1), init_values=None, abs_pos_embed=True, norm_cfg=dict(type="LN", eps=1e-5),
                     pretrained=str(tmp_path / "mim.safetensors"))
    vit.init_weights()  # what mmengine calls after building
    own = vit.state_dict()
    torch.testing.assert_close(own["backbone.encoder.layers.1.mlp.fc2.weight"], src["backbone.encoder.layers.1.mlp.fc2.weight"])
    torch.testing.assert_close(own["patch_embed.proj.weight"], src["heads.mim.patch_embed.proj.weight"])
    assert own["backbone.encoder.rel_pos.table"].shape == (15 * 15 + 3, 2)  # 4x4 -> 8x8 grid
    centre = lambda t, g: t[(g - 1) * (2 * g - 1) + (g - 1)]  # noqa: E731  offset (0, 0)
    torch.testing.assert_close(centre(own["backbone.encoder.rel_pos.table"], 8), centre(src["backbone.encoder.rel_pos.table"], 4))
    assert own["pos_embed"].shape == (1, 65, 32)
    torch.testing.assert_close(own["pos_embed"][:, 0], src["heads.mim.pos_embed"][:, 0])
    # another rule's weights are refused, naming the field
    mim_like_checkpoint(tmp_path / "preln.safetensors", grid=4, norm="preln")
    with pytest.raises(CheckpointError, match="norm: checkpoint 'preln' vs model 'magneto'"):
        load_vit_weights(vit, tmp_path / "preln.safetensors", vit.grid, vit.config.backbone)


def test_vit_checkpoint_loads_by_name(tmp_path):
    cfg = ViTConfig(backbone=BackboneConfig(**tiny_backbone(norm="preln")), img_size=16, patch_size=4, num_classes=5)
    vit = VisionTransformer(cfg)
    checkpoint.save(vit, tmp_path / "vit.safetensors")
    seg = MagnetoViT(norm="preln", img_size=24, patch_size=4, embed_dims=32, num_layers=2, num_heads=2, mlp_ratio=2,
                     out_indices=(1,), init_values=None, rel_pos=False, abs_pos_embed=True,
                     norm_cfg=dict(type="LN", eps=1e-5))
    report = load_vit_weights(seg, tmp_path / "vit.safetensors", seg.grid, seg.config.backbone)
    assert "head.weight" in report.unused and not [k for k in report.missing if "layers" in k]
    torch.testing.assert_close(seg.backbone.encoder.layers[0].attn.qkv.weight, vit.backbone.encoder.layers[0].attn.qkv.weight)
    assert seg.pos_embed.shape == (1, 1 + 36, 32)


# --------------------------------------------------------------------------- engine


def seg_config(tmp_path: Path, root: Path, **task) -> dict:
    return {
        "run_name": "seg", "output_dir": str(tmp_path), "seed": 0,
        "backbone": tiny_backbone(norm="magneto", final_norm=False),
        "tasks": [{"name": "segmentation", "data_root": str(root), "num_classes": demo.NUM_CLASSES, "img_size": 16,
                   "patch_size": 4, "abs_pos_embed": True, "out_indices": [0, 1, 0, 1], "channels": 8,
                   "aux_channels": 4, "test_stride": 8, "photometric": False, **task}],
        "optim": {"lr": 1e-3, "layer_decay": 0.9, "no_weight_decay": ["backbone.encoder.rel_pos.table"]},
        "schedule": {"name": "poly", "warmup_steps": 1},
        "train": {"steps": 2, "batch_size": 4},
        "eval": {"every": 0, "batch_size": 2},
        "save": {"every": 0, "keep": 1},
        "log": {"progress": False, "writers": ["jsonl"]},
    }


def test_engine_trains_and_evaluates_with_slide_and_whole(tmp_path, ade_tree):
    cfg, specs = resolve(seg_config(tmp_path, ade_tree))
    result = train(cfg, specs)
    assert result.status == "finished"
    m = result.metrics
    assert {"segmentation/mIoU", "segmentation/aAcc", "segmentation/mAcc", "segmentation/IoU.wall",
            "segmentation/IoU.bed "} <= set(m)
    assert 0 <= m["segmentation/aAcc"] <= 100
    assert (tmp_path / "seg" / "best" / "model.safetensors").is_file()
    model = checkpoint.load(tmp_path / "seg" / "best" / "model.safetensors").eval()  # rebuilt from the file alone
    head = model.heads["segmentation"]
    images = torch.randn(1, 3, 16, 22)
    whole = head.predict_logits(model.backbone, images, "whole")
    assert whole.shape == (1, demo.NUM_CLASSES, 16, 22)
    one_window = head.predict_logits(model.backbone, images[..., :16], "slide", crop=16, stride=8)
    torch.testing.assert_close(one_window, head.predict_logits(model.backbone, images[..., :16], "whole"))
    two = head.predict_logits(model.backbone, images, "slide", crop=16, stride=8)  # windows at x = 0 and 6
    assert two.shape == whole.shape
    torch.testing.assert_close(two[..., :6], one_window[..., :6])


def test_class_weight_is_the_weighted_mean_over_labelled_pixels(tmp_path, ade_tree):
    """class_weight reaches both heads' loss as sum_i w[y_i] nll_i / sum_i w[y_i] over the labelled
    pixels (brute force here), with ignored pixels in the batch (where mmseg's own class_weight path
    fails), and with every weight 1 it is mmseg's CrossEntropyLoss(avg_non_ignore=True)."""
    from mmseg.models.losses import CrossEntropyLoss

    from foundation_tasks.segmentation.model import ClassWeightedCE

    weights = [0.5, 2.0, 1.0, 1.0, 4.0, 1.0, 1.0, 2.5]
    logits = torch.randn(2, demo.NUM_CLASSES, 5, 6)
    label = torch.randint(0, demo.NUM_CLASSES, (2, 5, 6))
    label[0, :2] = 255
    nll = -torch.log_softmax(logits, 1).gather(1, label.clamp(max=demo.NUM_CLASSES - 1)[:, None])[:, 0]
    keep = label != 255
    w = torch.tensor(weights)[label.clamp(max=demo.NUM_CLASSES - 1)] * keep
    expected = 0.4 * (w * nll).sum() / w.sum()
    torch.testing.assert_close(ClassWeightedCE(weights, 0.4)(logits, label), expected)
    ones = ClassWeightedCE([1.0] * demo.NUM_CLASSES)(logits, label)
    torch.testing.assert_close(ones, CrossEntropyLoss(avg_non_ignore=True)(logits, label, ignore_index=255))

    cfg, specs = resolve(seg_config(tmp_path, ade_tree, class_weight=weights))
    model = build_model(cfg, specs)
    head = model.heads["segmentation"]
    labels = torch.randint(0, demo.NUM_CLASSES, (2, 16, 16))
    labels[:, :4] = 255  # "other" (ADE's 0, reduce_zero_label)
    loss, _ = head(model.backbone, {"images": torch.randn(2, 3, 16, 16), "labels": labels})
    loss.backward()
    assert torch.isfinite(loss) and head.decode_head.conv_seg.weight.grad.abs().sum() > 0
    for h in (head.decode_head, head.auxiliary_head):
        assert isinstance(h.loss_decode, ClassWeightedCE) and h.loss_decode.class_weight.tolist() == weights
    assert head.auxiliary_head.loss_decode.loss_weight == 0.4
    with pytest.raises(ConfigError, match=r"field 'class_weight': must be 8 weights >= 0, one per class"):
        resolve(seg_config(tmp_path, ade_tree, class_weight=[1.0, 2.0]))


def test_class_weights_tool_counts_the_training_pixels(tmp_path, ade_tree, capsys):
    import numpy as np
    import yaml
    from PIL import Image

    from foundation_tasks.segmentation.class_weights import balanced_weights, main, pixel_shares

    counts = np.zeros(9)
    for png in (ade_tree / "annotations" / "training").glob("*.png"):
        counts += np.bincount(np.asarray(Image.open(png)).ravel(), minlength=256)[:9]
    np.testing.assert_allclose(pixel_shares(ade_tree, 8), counts[1:] / counts[1:].sum())
    # median share 0.3: 0.1 -> sqrt(3), 0.6 -> sqrt(1/2); a class that never occurs weighs 1
    assert balanced_weights(np.array([0.1, 0.3, 0.6, 0.0])) == [1.732, 1.0, 0.707, 1.0]
    assert balanced_weights(np.array([0.1, 0.3, 0.6, 0.0]), power=1.0) == [3.0, 1.0, 0.5, 1.0]
    assert main([str(ade_tree), "--num-classes", "8"]) == 0
    line = yaml.safe_load(capsys.readouterr().out)
    resolve(seg_config(tmp_path, ade_tree, **line))  # the printed line is a valid config field
    assert main([str(tmp_path / "nowhere"), "--num-classes", "8"]) == 2
    assert "field 'data_root': directory not found" in capsys.readouterr().err


def test_engine_init_from_a_mim_run_loads_backbone_and_front_end(tmp_path, ade_tree):
    path = tmp_path / "mim.safetensors"
    src = mim_like_checkpoint(path, grid=4, rel_pos=False)
    raw = seg_config(tmp_path, ade_tree, img_size=24)  # grid 6: pos_embed resampled
    raw["init_from"] = str(path)
    cfg, specs = resolve(raw)
    model = build_model(cfg, specs, log=lambda s: None)
    torch.testing.assert_close(model.backbone.encoder.layers[0].attn.proj.weight, src["backbone.encoder.layers.0.attn.proj.weight"])
    head = model.heads["segmentation"]
    torch.testing.assert_close(head.patch_embed.proj.weight, src["heads.mim.patch_embed.proj.weight"])
    assert head.pos_embed.shape == (1, 37, 32)
    torch.testing.assert_close(head.pos_embed[:, 0], src["heads.mim.pos_embed"][:, 0])


def test_converter_resizes_a_rel_pos_checkpoint_for_init_from(tmp_path, ade_tree):
    src_path, out = tmp_path / "mim.safetensors", tmp_path / "seg_init.safetensors"
    mim_like_checkpoint(src_path, grid=4, rel_pos=True)
    raw = seg_config(tmp_path, ade_tree, img_size=24, abs_pos_embed=False)
    raw["backbone"].update(rel_pos="2d", rel_pos_grid=[6, 6])
    (tmp_path / "seg.yaml").write_text(json.dumps(raw))
    raw["init_from"] = str(src_path)
    direct = build_model(*resolve(raw), log=lambda s: None)  # init_from resizes the table (segmentation's hook)
    assert convert_main([str(src_path), str(out), "--config", str(tmp_path / "seg.yaml")]) == 0
    raw["init_from"] = str(out)
    model = build_model(*resolve(raw), log=lambda s: None)
    assert model.backbone.encoder.rel_pos.table.shape == (11 * 11 + 3, 2)
    torch.testing.assert_close(model.backbone.encoder.rel_pos.table, direct.backbone.encoder.rel_pos.table)


def test_config_errors_name_the_field(tmp_path, ade_tree):
    raw = seg_config(tmp_path, ade_tree)
    raw["backbone"].update(rel_pos="2d", rel_pos_grid=[8, 8])
    with pytest.raises(ConfigError, match=r"rel_pos_grid.*img_size / patch_size = \[4, 4\]"):
        resolve(raw)
    with pytest.raises(ConfigError, match="field 'out_indices': block 5 does not exist"):
        resolve(seg_config(tmp_path, ade_tree, out_indices=[0, 1, 1, 5]))
    with pytest.raises(ConfigError, match="field 'data_root': directory not found"):
        resolve(seg_config(tmp_path, tmp_path / "nowhere"))


@pytest.mark.parametrize("norm", ["magneto", "preln"])
@pytest.mark.parametrize("name", ["tiny", "ade20k_base", "ade20k_large"])
def test_repo_configs_validate(name, norm, ade_tree):
    from foundation.engine.config import load_config

    path = Path(__file__).resolve().parents[3] / "configs/segmentation" / f"{name}.yaml"
    cfg, specs = load_config(path, [f"tasks.segmentation.data_root={ade_tree}", f"backbone.norm={norm}"])  # runs check()
    assert cfg.backbone.norm == norm and cfg.run_name.endswith(norm)
    seg = specs[0].config
    assert seg.out_indices[-1] == cfg.backbone.depth - 1 and "pretrained" not in cfg.tasks[0]
    if name.startswith("ade20k"):
        assert (seg.img_size, seg.patch_size, seg.num_classes, seg.test_stride) == (640, 16, 150, 426)
        assert cfg.backbone.rel_pos_grid == [40, 40] and cfg.schedule.name == "poly"
    weights = ade_tree.parent / "weights.safetensors"  # any readable file: init_from is read when training
    save_file({"w": torch.zeros(1)}, str(weights))
    cfg, _ = load_config(path, [f"tasks.segmentation.data_root={ade_tree}", f"init_from={weights}"])
    assert cfg.init_from == str(weights)
