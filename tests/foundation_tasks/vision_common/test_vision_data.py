"""Vision data: the demo generator (deterministic, ImageNet layout), the ImageNet-folder
reader's errors (each names the file or folder), per-item seeded augmentation."""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from foundation.cli import main as cli_main
from foundation.config import ConfigError
from foundation.engine.data import seeded
from foundation_tasks.classification import demo
from foundation_tasks.vision_common.folder import ImageFolderDataset, check_root, find_classes, scan_split, verify_images
from foundation_tasks.vision_common.images import DecodedImages, ImageDataError, load_image
from foundation_tasks.vision_common.transforms import TransformConfig, _posterize, build_transform


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vision") / "demo"
    demo.write_dataset(root, seed=3, size=16, train_per_class=3, val_per_class=2, num_classes=3)
    return root


def copy_tree(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_demo_layout_and_determinism(demo_root, tmp_path):
    classes = list(demo.CLASSES[:3])
    assert find_classes(demo_root) == sorted(classes)
    for split, n in (("train", 3), ("val", 2)):
        for c in classes:
            files = sorted((demo_root / split / c).glob("*.JPEG"))
            assert len(files) == n and Image.open(files[0]).size == (16, 16)
    again = tmp_path / "again"
    demo.write_dataset(again, seed=3, size=16, train_per_class=3, val_per_class=2, num_classes=3)
    for f in demo_root.rglob("*.JPEG"):
        assert f.read_bytes() == (again / f.relative_to(demo_root)).read_bytes()
    other, _, _ = demo.scene(4, "train", 0, 16, 3)
    assert not np.array_equal(demo.scene(3, "train", 0, 16, 3)[0], other)


def test_demo_scene_mask_and_classes():
    image, mask, label = demo.scene(0, "val", 7, 32, 10)
    assert image.shape == (32, 32, 3) and image.dtype == np.uint8 and label == 7
    assert mask.shape == (32, 32) and 0 <= mask.min() and mask.max() <= 1 and 0.05 < mask.mean() < 0.8
    masks = [demo.shape_mask(name, 32, 16, 16, 12, 0.3) for name in demo.CLASSES]
    for i in range(len(masks)):  # every class is a different shape
        for j in range(i):
            assert np.abs(masks[i] - masks[j]).mean() > 0.02, (demo.CLASSES[i], demo.CLASSES[j])


def test_data_make_vision_cli(tmp_path, capsys):
    out = tmp_path / "d"
    assert cli_main(["data", "make", "vision", "--out", str(out), "--size", "16", "--train-per-class", "2",
                     "--val-per-class", "1", "--classes", "2"]) == 0
    assert "wrote 4 train + 2 val images" in capsys.readouterr().out
    assert len(list(out.rglob("*.JPEG"))) == 6
    assert cli_main(["data", "make", "vision", "--out", str(out)]) == 2  # not empty: refuses
    assert "pass --force" in capsys.readouterr().err
    assert cli_main(["data", "make", "vision", "--out", str(out), "--size", "16", "--train-per-class", "1",
                     "--val-per-class", "1", "--classes", "2", "--overwrite"]) == 0  # --force's deprecated spelling
    assert len(list(out.rglob("*.JPEG"))) == 4


def test_reader_reads_the_layout(demo_root):
    cfg = TransformConfig(img_size=16, crop_pct=1.0)
    ds = ImageFolderDataset(demo_root, "val", build_transform(cfg, train=False), expected_shape=(3, 16, 16))
    assert len(ds) == 6 and ds.classes == sorted(demo.CLASSES[:3])
    x, label = ds[0]
    assert x.shape == (3, 16, 16) and x.dtype == torch.float32 and label == 0
    check_root(str(demo_root))
    with pytest.raises(ConfigError, match="field 'data_dir'.*no such folder"):
        check_root(str(demo_root / "nope"))
    with pytest.raises(ConfigError, match="field 'data_dir': set it"):
        check_root(None)


def test_reader_errors_name_the_file(demo_root, tmp_path):
    root = copy_tree(demo_root, tmp_path / "bad")
    cls = sorted(demo.CLASSES[:3])[0]
    files = sorted((root / "train" / cls).glob("*.JPEG"))
    files[0].write_bytes(b"this is not a JPEG")  # corrupt
    data = files[1].read_bytes()
    files[1].write_bytes(data[: len(data) // 3])  # truncated
    transform = build_transform(TransformConfig(img_size=16, crop_pct=1.0), train=False)
    ds = ImageFolderDataset(root, "train", transform)
    with pytest.raises(ImageDataError, match=rf"{files[0]}: not an image file"):
        ds[0]
    with pytest.raises(ImageDataError, match=rf"{files[1]}: cannot read the image"):
        ds[1]
    n, errors = verify_images(root)
    assert n == 15 and len(errors) == 2 and all(str(f) in " ".join(errors) for f in files[:2])


def test_reader_errors_for_folders_and_sizes(demo_root, tmp_path):
    root = copy_tree(demo_root, tmp_path / "bad")
    classes = find_classes(root)
    empty = root / "val" / classes[1]
    for f in empty.iterdir():
        f.unlink()
    with pytest.raises(ImageDataError, match=rf"{empty}: empty class folder"):
        scan_split(root, "val", classes)
    (root / "val" / "zebra").mkdir()
    Image.new("RGB", (16, 16)).save(root / "val" / "zebra" / "z.JPEG")
    with pytest.raises(ImageDataError, match=r"class folder\(s\) zebra are not in"):
        scan_split(root, "val", classes)
    small = root / "train" / classes[0] / "tiny.png"
    Image.new("RGB", (3, 2)).save(small)
    with pytest.raises(ImageDataError, match=rf"{small}: the image is 3x2 pixels, smaller than min_image_size=8"):
        load_image(small, min_size=8)
    wrong = ImageFolderDataset(root, "train", lambda im: torch.zeros(3, im.size[1], im.size[0]), classes=classes,
                               expected_shape=(3, 16, 16))
    index = [str(p) for p, _ in wrong.samples].index(str(small))
    with pytest.raises(ImageDataError, match=rf"{small}: the transform gave an image of shape \(3, 2, 3\), "
                                             r"expected \(3, 16, 16\)"):
        wrong[index]
    (root / "train").rename(root / "training")
    with pytest.raises(ImageDataError, match="train: no such folder; expected the ImageNet layout"):
        find_classes(root)


def test_augmentation_is_per_item_and_leaves_global_rng(demo_root):
    cfg = TransformConfig(img_size=16, crop_pct=1.0)
    ds = ImageFolderDataset(demo_root, "train", build_transform(cfg, train=True), random_transform=True)
    torch.manual_seed(0)
    a = [ds[i][0] for i in range(3)]
    torch.manual_seed(0)
    b = [ds[i][0] for i in range(3)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))  # a function of (base seed, index)
    assert not torch.equal(ds[0][0], ds[0][0])  # ... and a new base per draw: new epochs differ
    random.seed(5)
    np.random.seed(5)
    expected = (random.random(), np.random.rand())
    random.seed(5)
    np.random.seed(5)
    with seeded(123):
        random.random(), np.random.rand(), torch.rand(1)
    assert (random.random(), np.random.rand()) == expected


def test_cache_images_reads_each_file_once_and_changes_no_item(demo_root, monkeypatch):
    import foundation_tasks.vision_common.folder as folder

    opened = []

    def counting(path, *args, **kwargs):
        opened.append(Path(path).name)
        return load_image(path, *args, **kwargs)

    monkeypatch.setattr(folder, "load_image", counting)
    cfg = TransformConfig(img_size=16, crop_pct=1.0)  # RandAugment, crops, flips, erasing: the recipe's kind
    plain = ImageFolderDataset(demo_root, "train", build_transform(cfg, train=True), random_transform=True)
    cached = ImageFolderDataset(demo_root, "train", build_transform(cfg, train=True), random_transform=True,
                                cache_images=True)
    for epoch in range(3):
        torch.manual_seed(epoch)
        a = [plain[i][0] for i in range(len(plain))]
        torch.manual_seed(epoch)
        b = [cached[i][0] for i in range(len(cached))]
        assert all(torch.equal(x, y) for x, y in zip(a, b))  # the same augmented items, epoch after epoch
    n = len(plain)
    assert len(opened) == 3 * n + n  # the plain set opens every file every epoch, the cached one once


def test_decoded_images_hand_out_copies():
    loads = []

    def load():
        loads.append(1)
        return Image.new("RGB", (4, 4), (10, 20, 30))

    cache = DecodedImages(enabled=True)
    first = cache.get("a.jpg", load)
    first.putpixel((0, 0), (255, 0, 0))  # a transform editing its input in place
    assert cache.get("a.jpg", load).getpixel((0, 0)) == (10, 20, 30) and len(loads) == 1
    off = DecodedImages(enabled=False)
    off.get("a.jpg", load), off.get("a.jpg", load)
    assert len(loads) == 3  # off: every call reads the file


def test_randaugment_survives_new_pillow():
    """timm's PosterizeIncreasing asks Pillow >= 12 for 0 bits, which it refuses."""
    im = Image.new("RGB", (8, 8), (200, 100, 50))
    assert np.asarray(_posterize(im, 0)).max() == 0 and _posterize(im, 8) is im
    transform = build_transform(TransformConfig(img_size=16, auto_augment="rand-m10-mstd0.5-inc1"), train=True)
    im = Image.fromarray(demo.scene(0, "train", 0, 16, 3)[0])
    for s in range(150):
        with seeded(s):
            assert transform(im).shape == (3, 16, 16)


def test_a_batch_fetched_at_once_is_the_items_fetched_one_by_one(demo_root):
    """The engine's loader fetches a batch inside ``items_fetched`` (NumPy's global state saved
    once, not per item): the same items, bit for bit, as one ``seeded`` item at a time, with
    RandAugment (which draws from NumPy's global RNG), and every global RNG after the batch
    where it would have been."""
    from foundation.engine.data import BatchFetch

    cfg = TransformConfig(img_size=16, crop_pct=1.0, auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.5)
    ds = ImageFolderDataset(demo_root, "train", build_transform(cfg, train=True), random_transform=True)
    indices = [4, 0, 7, 2, 2, 5]

    def fetch(one_by_one: bool):
        torch.manual_seed(11)
        random.seed(11)
        np.random.seed(11)
        items = [ds[i] for i in indices] if one_by_one else BatchFetch(ds).__getitems__(indices)
        return items, (torch.rand(2), random.random(), np.random.rand(2))

    (a, after_a), (b, after_b) = fetch(True), fetch(False)
    assert all(torch.equal(x, y) and la == lb for (x, la), (y, lb) in zip(a, b))
    assert torch.equal(after_a[0], after_b[0]) and after_a[1] == after_b[1] and np.array_equal(after_a[2], after_b[2])
    assert not torch.equal(a[3][0], a[4][0])  # the same index twice: two draws, two augmentations


def random_images(*sizes: tuple[int, int]) -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]


def assert_same_items(ours, reference, images, seeds: int) -> None:
    """Under each item seed, ``ours`` gives ``reference``'s tensor bit for bit."""
    for im in images:
        for s in range(seeds):
            with seeded(s):
                a = ours(im)
            with seeded(s):
                b = reference(im)
            assert a.dtype == b.dtype and a.is_contiguous() and torch.equal(a, b), (im.size, s)


def test_fused_to_tensor_matches_timm_bit_for_bit():
    """The fused MaybeToTensor + Normalize gives timm's own transforms' tensors exactly."""
    from timm.data import create_transform

    from foundation_tasks.vision_common.transforms import (MEAN, STD, ToNormalizedTensor, _fix_posterize,
                                                           pretrain_transform)

    cfg = TransformConfig(img_size=16, auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25)
    pairs = [(build_transform(cfg, train=True),
              _fix_posterize(create_transform(16, is_training=True, auto_augment=cfg.auto_augment, re_prob=0.25,
                                              re_mode="pixel", scale=(0.08, 1.0), interpolation="bicubic",
                                              mean=MEAN, std=STD))),
             (build_transform(cfg, train=False),
              create_transform(16, is_training=False, interpolation="bicubic", crop_pct=0.875, mean=MEAN, std=STD)),
             (pretrain_transform(16), create_transform(16, is_training=True, color_jitter=0.4, re_prob=0.0,
                                                       interpolation="bicubic", mean=MEAN, std=STD))]
    for fused, timm_own in pairs:
        assert sum(isinstance(t, ToNormalizedTensor) for t in fused.transforms) == 1
        assert_same_items(fused, timm_own, random_images((20, 24), (16, 16)), seeds=20)
    tensor = torch.rand(3, 16, 16)  # not an RGB image: the pair itself
    op = next(t for t in pairs[1][0].transforms if isinstance(t, ToNormalizedTensor))
    assert torch.equal(op(tensor), op.normalize(op.to_tensor(tensor)))


def test_whole_image_crop_matches_timm_bit_for_bit():
    """At area scale (1, 1), flips only (the demo's recipe), the crop is skipped on images already square at the
    output size and the items are timm's own, bit for bit; with anything after it that draws from Python's RNG
    (RandAugment) it stays timm's crop, whose draws that op's then follow."""
    from timm.data import create_transform

    from foundation_tasks.vision_common.transforms import (MEAN, STD, WholeImageCrop, _whole_image_crop,
                                                           pretrain_transform)

    flips = TransformConfig(img_size=16, scale=[1.0, 1.0], auto_augment=None, color_jitter=0.0, re_prob=0.0)
    pairs = [(build_transform(flips, train=True),
              create_transform(16, is_training=True, auto_augment=None, color_jitter=None, re_prob=0.0,
                               scale=(1.0, 1.0), interpolation="bicubic", mean=MEAN, std=STD)),
             (pretrain_transform(16, scale=(1.0, 1.0), color_jitter=0.0),
              create_transform(16, is_training=True, color_jitter=None, re_prob=0.0, scale=(1.0, 1.0),
                               interpolation="bicubic", mean=MEAN, std=STD))]
    images = random_images((16, 16), (20, 24), (24, 24))
    for ours, timm_own in pairs:
        assert isinstance(ours.transforms[0], WholeImageCrop)
        assert_same_items(ours, timm_own, images, seeds=30)
    # the image itself is never handed on: a cached image stays untouched by what follows
    crop = pairs[0][0].transforms[0]
    assert crop(images[0]) is not images[0] and crop(images[0]).tobytes() == images[0].tobytes()
    for cfg in (TransformConfig(img_size=16, scale=[1.0, 1.0], auto_augment="rand-m9-mstd0.5-inc1"),
                TransformConfig(img_size=16, scale=[1.0, 1.0], auto_augment=None, re_prob=0.25),
                TransformConfig(img_size=16, scale=[0.5, 1.0], auto_augment=None, re_prob=0.0)):
        assert not isinstance(build_transform(cfg, train=True).transforms[0], WholeImageCrop), cfg
    # an aspect ratio range without 1 crops a square image narrower: timm's crop stays
    narrow = create_transform(16, is_training=True, auto_augment=None, color_jitter=None, re_prob=0.0,
                              scale=(1.0, 1.0), ratio=(1.2, 1.5), interpolation="bicubic", mean=MEAN, std=STD)
    assert not isinstance(_whole_image_crop(narrow).transforms[0], WholeImageCrop)


def test_kept_bytes_give_timms_items_bit_for_bit(demo_root, tmp_path):
    """With ``cache_images`` and flips only, a square image at the output size is kept as its bytes and
    each item is their flip, normalised: the items of timm's own transform bit for bit, epoch after epoch,
    with the global RNGs where timm's leave them; another image (not square) goes through the transform."""
    from timm.data import create_transform

    from foundation.engine.data import BatchFetch
    from foundation_tasks.vision_common.transforms import MEAN, STD, flip_of_bytes

    root = copy_tree(demo_root, tmp_path / "mixed")
    odd = sorted((root / "train").rglob("*.JPEG"))[1]
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (20, 16, 3), dtype=np.uint8)).save(odd)
    flips = TransformConfig(img_size=16, scale=[1.0, 1.0], auto_augment=None, color_jitter=0.0, re_prob=0.0)
    ours = ImageFolderDataset(root, "train", build_transform(flips, train=True), random_transform=True,
                              cache_images=True)
    timm_own = ImageFolderDataset(root, "train", create_transform(
        16, is_training=True, auto_augment=None, color_jitter=None, re_prob=0.0, scale=(1.0, 1.0),
        interpolation="bicubic", mean=MEAN, std=STD), random_transform=True)
    assert ours.split_flip is not None and timm_own.split_flip is None
    indices = list(range(len(ours))) * 3  # the first read keeps the bytes, the next ones use them

    def fetch(ds):
        torch.manual_seed(5)
        items = BatchFetch(ds).__getitems__(indices)
        return items, torch.rand(2)

    (a, after_a), (b, after_b) = fetch(ours), fetch(timm_own)
    assert all(x.is_contiguous() and torch.equal(x, y) and la == lb for (x, la), (y, lb) in zip(a, b))
    assert torch.equal(after_a, after_b)
    n = len(ours)  # the same image in three epochs: flipped in some, not in others
    assert any(not torch.equal(a[i][0], a[i + n][0]) or not torch.equal(a[i][0], a[i + 2 * n][0]) for i in range(n))
    kept = {Path(k).name: v for k, v in ours.kept_bytes.items()}
    assert kept[odd.name] is None and sum(v is not None for v in kept.values()) == len(ours) - 1
    assert all(v.dtype == torch.uint8 for v in kept.values() if v is not None)
    assert list(ours.decoded.images) == [str(odd)]  # the kept bytes stand in for the other images
    for cfg in (TransformConfig(img_size=16, scale=[0.5, 1.0], auto_augment=None, color_jitter=0.0, re_prob=0.0),
                TransformConfig(img_size=16, scale=[1.0, 1.0], auto_augment=None, color_jitter=0.0, re_prob=0.25)):
        assert flip_of_bytes(build_transform(cfg, train=True)) is None, cfg
    no_flip = TransformConfig(img_size=16, scale=[1.0, 1.0], auto_augment=None, color_jitter=0.0, re_prob=0.0,
                              hflip=0.0)
    assert flip_of_bytes(build_transform(no_flip, train=True)).flip_p is None
