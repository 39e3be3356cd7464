"""Segmentation through mmseg on mmcv-lite: the compatibility step, MagnetoViT and its
layer-decay constructor built from an mmseg config, the full EncoderDecoder forward /
backward on a generated ADE20k tree, IoUMetric on a hand-made prediction, and clear data
errors. All CPU, tiny."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from foundation_tasks.segmentation import mmseg_compat

mmseg_compat.import_mmseg()

from mmengine.config import Config  # noqa: E402
from mmengine.optim import build_optim_wrapper  # noqa: E402
from mmengine.registry import DefaultScope  # noqa: E402
from mmengine.structures import PixelData  # noqa: E402
from mmseg.evaluation import IoUMetric  # noqa: E402
from mmseg.registry import DATASETS, MODELS  # noqa: E402
from mmseg.structures import SegDataSample  # noqa: E402

from foundation.config import ConfigError  # noqa: E402
from foundation_tasks.segmentation import demo  # noqa: E402
from foundation_tasks.segmentation.data import check_layout  # noqa: E402
from foundation_tasks.segmentation.metrics import iou_sums, seg_metrics  # noqa: E402
from foundation_tasks.segmentation.mmseg_backbone import MagnetoViT  # noqa: E402
from foundation_tasks.segmentation.transforms import AnnotationError  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def ade_tree(write_ade_tree) -> Path:
    return write_ade_tree(n_train=2, n_val=2, height=40, width=56)


# --------------------------------------------------------------------------- mmcv-lite


def test_stand_in_serves_pure_pytorch_ops_and_refuses_compiled_ones():
    import mmcv.ops
    from mmcv.ops import point_sample
    from mmseg.models.losses import focal_loss

    assert mmseg_compat.ops_are_stand_in()  # this environment has mmcv-lite
    feats = torch.arange(16.0).view(1, 1, 4, 4)
    # point_sample is mmcv's own pure-PyTorch code: the centre of pixel (1, 2) is (2.5/4, 1.5/4)
    out = point_sample(feats, torch.tensor([[[2.5 / 4, 1.5 / 4]]]), align_corners=False)
    assert out.item() == pytest.approx(6.0)
    # a compiled op is missing for everyone but mmseg's own modules: an ImportError at import
    with pytest.raises(ImportError, match="sigmoid_focal_loss needs mmcv's compiled extension"):
        from mmcv.ops import sigmoid_focal_loss  # noqa: F401
    # mmseg's focal_loss.py imports it unconditionally: a placeholder that refuses on use
    placeholder = focal_loss._sigmoid_focal_loss
    with pytest.raises(mmseg_compat.MissingCompiledOp, match="sigmoid_focal_loss needs mmcv's compiled extension"):
        placeholder(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))
    assert isinstance(torch.nn.Linear(1, 1), placeholder) is False  # still usable in isinstance
    with pytest.raises(AttributeError):
        mmcv.ops.__wrapped__  # dunders are AttributeErrors, as the import machinery expects
    with pytest.raises(ImportError):
        from mmcv.ops import not_an_op  # noqa: F401


@pytest.mark.parametrize("case", ["compiled", "imported"])
def test_stand_in_steps_aside_when_real_ops_exist(case):
    setup = {
        "compiled": "c._has_compiled_ops = lambda: True",  # as with full mmcv (mmcv._ext importable)
        "imported": "import types; sys.modules['mmcv.ops'] = real = types.ModuleType('mmcv.ops')",
    }[case]
    # the module alone (importing the package would import mmseg, installing the stand-in)
    load = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('compat', "
            "'foundation_tasks/segmentation/mmseg_compat.py'); c = importlib.util.module_from_spec(spec); "
            "spec.loader.exec_module(c)")
    code = (f"{load}; {setup}\n"
            "assert c.install() is False and not c.ops_are_stand_in()\n"
            + ("assert 'mmcv.ops' not in sys.modules\n" if case == "compiled" else "assert sys.modules['mmcv.ops'] is real\n"))
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)


# --------------------------------------------------------------------------- mmseg config

# The README's mmseg-native snippet, as a config dict (tiny sizes).
MMSEG_SNIPPET = dict(
    type="EncoderDecoder",
    data_preprocessor=dict(type="SegDataPreProcessor", mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
                           bgr_to_rgb=True, pad_val=0, seg_pad_val=255, size=(32, 32)),
    backbone=dict(type="MagnetoViT", norm="magneto", img_size=32, patch_size=8, embed_dims=32, num_layers=4,
                  num_heads=2, out_indices=(0, 1, 2, 3), drop_path_rate=0.1, init_values=0.1),
    neck=dict(type="Feature2Pyramid", embed_dim=32, rescales=[4, 2, 1, 0.5], norm_cfg=dict(type="BN")),
    decode_head=dict(type="UPerHead", in_channels=[32] * 4, in_index=[0, 1, 2, 3], pool_scales=(1, 2, 3, 6),
                     channels=16, dropout_ratio=0.1, num_classes=8, norm_cfg=dict(type="BN"), align_corners=False,
                     loss_decode=dict(type="CrossEntropyLoss", use_sigmoid=False, loss_weight=1.0)),
    auxiliary_head=dict(type="FCNHead", in_channels=32, in_index=2, channels=8, num_convs=1, concat_input=False,
                        dropout_ratio=0.1, num_classes=8, norm_cfg=dict(type="BN"), align_corners=False,
                        loss_decode=dict(type="CrossEntropyLoss", use_sigmoid=False, loss_weight=0.4)),
    train_cfg=dict(),
    test_cfg=dict(mode="slide", crop_size=(32, 32), stride=(21, 21)),
)


def build_segmentor(**backbone):
    cfg = Config(dict(model=MMSEG_SNIPPET))
    cfg.model.backbone.update(backbone)
    with DefaultScope.overwrite_default_scope("mmseg"):
        model = MODELS.build(cfg.model)
    model.init_weights()
    return model


def ade_batch(root: Path, n: int = 2, crop: bool = True) -> dict:
    pipeline = [
        dict(type="LoadImageFromFile"),
        dict(type="LoadCheckedAnnotations", num_classes=8),
        *([dict(type="RandomCrop", crop_size=(32, 32))] if crop else []),
        dict(type="PackSegInputs"),
    ]
    with DefaultScope.overwrite_default_scope("mmseg"):
        ds = DATASETS.build(dict(type="ADE20KDataset", data_root=str(root), pipeline=pipeline,
                                 data_prefix=dict(img_path="images/training", seg_map_path="annotations/training"),
                                 metainfo=dict(classes=demo_classes())))
    items = [ds[i] for i in range(n)]
    return {"inputs": [it["inputs"] for it in items], "data_samples": [it["data_samples"] for it in items]}


def demo_classes():
    from foundation_tasks.segmentation.data import class_names

    return class_names(demo.NUM_CLASSES)


def test_encoder_decoder_forward_backward_on_an_ade_tree(ade_tree):
    model = build_segmentor()
    assert isinstance(model.backbone, MagnetoViT)
    data = model.data_preprocessor(ade_batch(ade_tree), training=True)
    assert data["inputs"].shape == (2, 3, 32, 32)
    losses = model(**data, mode="loss")
    assert {"decode.loss_ce", "decode.acc_seg", "aux.loss_ce", "aux.acc_seg"} <= set(losses)
    total = sum(v for k, v in losses.items() if "loss" in k)
    assert torch.isfinite(total)
    total.backward()
    for name in ("backbone.patch_embed.proj.weight", "backbone.backbone.encoder.layers.0.attn.qkv.weight",
                 "backbone.backbone.encoder.layers.3.mlp.fc2.weight", "neck.upsample_4x.0.weight",
                 "decode_head.conv_seg.weight", "auxiliary_head.conv_seg.weight"):
        grad = dict(model.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name
    # sliding-window prediction (32x32 windows over the 40x56 image) at the original size
    model.eval()
    with torch.no_grad():
        out = model.test_step(ade_batch(ade_tree, 1, crop=False))
    assert out[0].pred_sem_seg.data.shape[-2:] == out[0].gt_sem_seg.data.shape[-2:] == (40, 56)


def test_magneto_vit_returns_beit_style_maps_and_magneto_init():
    vit = MagnetoViT(norm="magneto", img_size=32, patch_size=8, embed_dims=32, num_layers=4, num_heads=2,
                     out_indices=(1, 3), init_values=None).eval()
    maps = vit(torch.randn(2, 3, 32, 32))
    assert [m.shape for m in maps] == [(2, 32, 4, 4)] * 2
    # the same computation as our VisionTransformer's timm-style intermediates
    ref = vit.forward_intermediates(torch.zeros(1, 3, 32, 32), indices=[1, 3], intermediates_only=True)
    got = vit(torch.zeros(1, 3, 32, 32))
    for a, b in zip(ref, got):
        torch.testing.assert_close(a, b)
    assert vit.backbone.scales["encoder"].gain == pytest.approx(np.sqrt(np.log(8)))  # sqrt(log 2N), N=4
    with pytest.raises(ValueError, match="out_indices 4 does not exist"):
        MagnetoViT(img_size=32, patch_size=8, embed_dims=32, num_layers=4, num_heads=2, out_indices=(4,))


def build_optimizer(model, cfg):
    with DefaultScope.overwrite_default_scope("mmseg"):
        return build_optim_wrapper(model, cfg)


def test_layer_decay_constructor_from_an_mmseg_config():
    model = build_segmentor(num_layers=4)
    wrapper = build_optimizer(model, dict(
        type="OptimWrapper", optimizer=dict(type="AdamW", lr=1e-3, weight_decay=0.05),
        constructor="MagnetoLayerDecayOptimizerConstructor", paramwise_cfg=dict(num_layers=4, layer_decay_rate=0.9)))
    groups = {}
    for g in wrapper.optimizer.param_groups:
        for name in g["param_names"]:
            groups[name] = g
    L = 4
    expect = {
        "backbone.patch_embed.proj.weight": (0.9 ** (L + 1), 0.05),
        "backbone.cls_token": (0.9 ** (L + 1), 0.0),
        "backbone.backbone.encoder.layers.0.attn.qkv.weight": (0.9 ** L, 0.05),
        "backbone.backbone.encoder.layers.0.attn.qkv.bias": (0.9 ** L, 0.0),
        "backbone.backbone.encoder.layers.3.mlp.fc1.weight": (0.9 ** 1, 0.05),
        "backbone.backbone.encoder.rel_pos.table": (1.0, 0.0),
        "decode_head.conv_seg.weight": (1.0, 0.05),
        "neck.upsample_4x.0.weight": (1.0, 0.05),
    }
    for name, (scale, wd) in expect.items():
        assert groups[name]["lr"] == pytest.approx(1e-3 * scale), name
        assert groups[name]["weight_decay"] == wd, name
    with pytest.raises(ValueError, match="num_layers=12 but the backbone has 4"):
        build_optimizer(model, dict(type="OptimWrapper", optimizer=dict(type="AdamW", lr=1e-3),
                                        constructor="MagnetoLayerDecayOptimizerConstructor",
                                        paramwise_cfg=dict(num_layers=12, layer_decay_rate=0.9)))


def test_repo_mmseg_configs_parse_and_name_our_modules():
    for path in sorted((REPO / "configs/segmentation/mmseg").glob("*.py")):
        cfg = Config.fromfile(str(path))
        assert cfg.model.backbone.type == "MagnetoViT", path
        assert cfg.optim_wrapper.constructor == "MagnetoLayerDecayOptimizerConstructor", path
        assert cfg.optim_wrapper.paramwise_cfg.num_layers == cfg.model.backbone.num_layers, path
    base = Config.fromfile(str(REPO / "configs/segmentation/mmseg/magneto-base_upernet_8xb2-160k_ade20k-640x640.py"))
    assert base.model.backbone.out_indices == (3, 5, 7, 11) and base.model.neck.rescales == [4, 2, 1, 0.5]
    assert base.model.decode_head.channels == 768 and base.model.auxiliary_head.loss_decode.loss_weight == 0.4
    assert base.model.test_cfg == dict(mode="slide", crop_size=(640, 640), stride=(426, 426))
    assert base.optim_wrapper.optimizer.lr == 3e-5 and base.optim_wrapper.paramwise_cfg.layer_decay_rate == 0.9


# --------------------------------------------------------------------------- metric


def test_iou_metric_on_a_hand_made_prediction():
    # 3 classes, 4x4; 255 = ignore. Per class: intersection / union
    label = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 2, 2], [255, 255, 2, 2]])
    pred = torch.tensor([[0, 0, 1, 0], [0, 1, 1, 1], [2, 2, 2, 1], [0, 0, 2, 2]])
    # class 0: pred {(0,0),(0,1),(0,3),(1,0)} vs label {(0,0),(0,1),(1,0),(1,1)} -> I 3, U 5
    # class 1: pred {(0,2),(1,1),(1,2),(1,3),(2,3)} vs label {(0,2),(0,3),(1,2),(1,3)} -> I 3, U 6
    # class 2: pred {(2,0),(2,1),(2,2),(3,2),(3,3)} vs label {(2,*),(3,2),(3,3)} -> I 5, U 6
    iou = np.array([3 / 5, 3 / 6, 5 / 6])
    miou = iou.mean() * 100
    aacc = (3 + 3 + 5) / 14 * 100  # 14 labelled pixels
    metric = IoUMetric(iou_metrics=["mIoU"])
    metric.dataset_meta = dict(classes=("a", "b", "c"))
    sample = SegDataSample(pred_sem_seg=PixelData(data=pred[None]), gt_sem_seg=PixelData(data=label[None]))
    metric.process({}, [sample.to_dict()])
    mm = metric.compute_metrics(metric.results)
    assert mm["mIoU"] == pytest.approx(round(miou, 2)) and mm["aAcc"] == pytest.approx(round(aacc, 2))
    # ours: the same histograms summed the engine's way, split over two "batches"
    half = [iou_sums(pred[:2], label[:2], 3), iou_sums(pred[2:], label[2:], 3)]
    totals = {k: half[0][k] + half[1][k] for k in half[0]}
    ours = seg_metrics(totals, ("a", "b", "c"))
    assert ours["mIoU"] == pytest.approx(miou) and ours["aAcc"] == pytest.approx(aacc)
    assert [ours[f"IoU.{c}"] for c in "abc"] == pytest.approx(list(iou * 100))


# --------------------------------------------------------------------------- data


def test_demo_data_is_deterministic_and_in_the_ade_layout(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert demo.main(["--out", str(a), "--train", "3", "--val", "2", "--height", "40", "--width", "56"]) == 0
    demo.main(["--out", str(b), "--train", "3", "--val", "2", "--height", "40", "--width", "56"])
    demo.main(["--out", str(c), "--train", "3", "--val", "2", "--height", "40", "--width", "56", "--seed", "1"])
    names = sorted(p.relative_to(a).as_posix() for p in a.rglob("*.*"))
    assert "images/training/ADE_train_00000001.jpg" in names and "annotations/validation/ADE_val_00000002.png" in names
    for rel in names:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    assert any((a / rel).read_bytes() != (c / rel).read_bytes() for rel in names)
    label = np.asarray(Image.open(a / "annotations/training/ADE_train_00000001.png"))
    assert label.dtype == np.uint8 and label.shape == (40, 56) and label.max() <= demo.NUM_CLASSES
    check_layout(a)
    assert not (a / "unlabelled").exists()  # the pool only when asked for


def test_demo_unlabelled_pool_holds_the_training_scenes_and_others(tmp_path):
    from foundation_tasks.vision_common.folder import ImageFolderDataset

    out = tmp_path / "ade"
    assert demo.main(["--out", str(out), "--train", "3", "--val", "2", "--height", "40", "--width", "56",
                      "--unlabelled", "4"]) == 0
    pool = out / "unlabelled"
    train = sorted(p.name for p in (pool / "train" / "scenes").iterdir())
    assert train == [f"ADE_train_{i:08d}.jpg" for i in (1, 2, 3)] + [f"pool_{i:08d}.jpg" for i in (1, 2, 3, 4)]
    for i in (1, 2, 3):  # the training scenes, the same files
        name = f"ADE_train_{i:08d}.jpg"
        assert (pool / "train" / "scenes" / name).read_bytes() == (out / "images" / "training" / name).read_bytes()
    labelled = {(out / "images" / "training" / f"ADE_train_{i:08d}.jpg").read_bytes() for i in (1, 2, 3)}
    assert not labelled & {(pool / "train" / "scenes" / f"pool_{i:08d}.jpg").read_bytes() for i in (1, 2, 3, 4)}
    assert len(list((pool / "val" / "scenes").iterdir())) == demo.POOL_VAL
    assert len(ImageFolderDataset(pool, "train", lambda im: im)) == 7  # what the MIM task reads


def corrupt_copy(src: Path, dst: Path, how: str) -> Path:
    import shutil

    shutil.copytree(src, dst)
    ann = dst / "annotations/training/ADE_train_00000001.png"
    label = np.asarray(Image.open(ann)).copy()
    if how == "range":
        label[0, 0] = 9  # class ids are 1..8 (0 = other)
        Image.fromarray(label).save(ann)
    elif how == "size":
        Image.fromarray(label[:-4]).save(ann)
    elif how == "rgb":
        Image.fromarray(np.stack([label] * 3, -1)).save(ann)
    elif how == "missing":
        ann.unlink()
    return ann


@pytest.mark.parametrize("how, error, match", [
    ("range", AnnotationError, r"label values \[9\] are outside the class range"),
    ("size", AnnotationError, r"annotation is 56x36 \(WxH\) but its image .*ADE_train_00000001.jpg is 56x40"),
    ("rgb", AnnotationError, "single-channel label map"),
    ("missing", FileNotFoundError, "annotation not found"),
])
def test_bad_annotations_fail_naming_the_file(ade_tree, tmp_path, how, error, match):
    root = tmp_path / "bad"
    ann = corrupt_copy(ade_tree, root, how)
    with pytest.raises(error, match=match) as info:
        ade_batch(root, 1)
    assert str(ann) in str(info.value)
    if how == "missing":  # the engine finds it before any work starts
        with pytest.raises(ConfigError, match=r"1 image\(s\) have no annotation file: .*ADE_train_00000001.png"):
            check_layout(root)


@pytest.mark.slow
def test_mmseg_runner_trains_validates_and_resumes_the_tiny_config(ade_tree, tmp_path, monkeypatch):
    """mmseg's own training loop on the repo's tiny mmseg-native config (a few iterations)."""
    from mmengine.runner import Runner

    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # mmengine's own iter_N.pth (see mmseg_compat)
    cfg = Config.fromfile(str(REPO / "configs/segmentation/mmseg/tiny-magneto_upernet_demo-48x48.py"))
    cfg.work_dir = str(tmp_path / "work")
    for loader in (cfg.train_dataloader, cfg.val_dataloader):
        loader.dataset.data_root = str(ade_tree)
        loader.batch_size = 2
    cfg.test_dataloader = cfg.val_dataloader
    cfg.train_cfg.update(max_iters=3, val_interval=3)
    cfg.param_scheduler = [dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=3)]
    cfg.default_hooks.checkpoint.interval = 3
    runner = Runner.from_cfg(cfg)
    runner.train()
    metrics = runner.val_loop.run()
    assert {"mIoU", "aAcc", "mAcc"} <= set(metrics)
    cfg.resume, cfg.train_cfg.max_iters = True, 4
    Runner.from_cfg(cfg).train()
    assert (tmp_path / "work" / "iter_4.pth").is_file()
