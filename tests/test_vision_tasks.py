"""The vision chain through the engine on tiny data: VQ-KD tokenizer (pixel and open_clip
teachers, codebook usage), MIM (loss drops on a fixed batch), MIM weights into the
classifier (only the head missing), fine-tuning with timm's transforms, Mixup and
layer decay, top-1 / top-5."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from foundation.config import ConfigError
from foundation.engine.config import apply_override, load_config, resolve
from foundation.engine.loop import train
from foundation.engine.model import ModelConfig, MultiTaskModel
from foundation.engine.optim import layer_ids, param_groups
from tasks.classification import demo
from tasks.vq_tokenizer.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[1]
BACKBONE = {"dim": 32, "depth": 2, "heads": 2, "ffn_dim": 64}
IMAGE = {"img_size": 16, "patch_size": 4}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vision") / "demo"
    demo.write_dataset(root, seed=0, size=16, train_per_class=8, val_per_class=4, num_classes=3)
    return root


def config(out: Path, name: str, task: dict, norm: str = "magneto", **sections) -> dict:
    cfg = {"run_name": name, "output_dir": str(out), "seed": 0, "backbone": {**BACKBONE, "norm": norm},
           "tasks": [task], "optim": {"lr": 2e-3}, "schedule": {"warmup_steps": 1},
           "train": {"steps": 3, "batch_size": 8}, "eval": {"batch_size": 12}, "save": {"keep": 1},
           "log": {"progress": False, "tensorboard": False}}
    cfg.update(sections)
    return cfg


def run(cfg: dict, *overrides: str):
    raw = OmegaConf.create(cfg)
    for o in overrides:
        apply_override(raw, o)
    return train(*resolve(raw))


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def tokenizer(data, tmp_path_factory) -> Path:
    """A tokenizer trained for a few steps (pixel teacher): its checkpoint."""
    out = tmp_path_factory.mktemp("runs")
    task = {"name": "vq_tokenizer", "data_dir": str(data), **IMAGE, "num_codes": 64, "code_dim": 8,
            "decoder_depth": 1, "teacher": "pixels"}
    result = run(config(out, "tok", task, train={"steps": 4, "batch_size": 12}))
    assert result.status == "finished"
    return result.run_dir / "best" / "model.safetensors"


def mim_task(data, tokenizer) -> dict:
    return {"name": "mim", "data_dir": str(data), "tokenizer": str(tokenizer), **IMAGE, "num_masking_patches": 6,
            "min_num_patches": 2, "scale": [0.5, 1.0]}


def test_tokenizer_trains_and_reports_codebook_usage(tokenizer):
    run_dir = tokenizer.parents[1]
    recs = records(run_dir)
    train_recs = [r for r in recs if "vq_tokenizer/codes_in_batch" in r]
    assert train_recs and all(0 < r["vq_tokenizer/codes_in_batch"] <= 1 for r in train_recs)
    final = [r for r in recs if "eval/vq_tokenizer/codebook_usage" in r][-1]
    assert 0 < final["eval/vq_tokenizer/codebook_usage"] <= 1
    assert 1 <= final["eval/vq_tokenizer/perplexity"] <= 64
    assert final["eval/vq_tokenizer/rec_loss"] > 0
    tok = load_tokenizer(tokenizer)  # frozen: encodes, never updates its codebook
    images = torch.randn(2, 3, 16, 16)
    before = tok.head.quantize.codebook.clone()
    tok.train()
    ids = tok(images)
    assert ids.shape == (2, 16) and ids.dtype == torch.long and ids.max() < 64
    assert torch.equal(before, tok.head.quantize.codebook) and not tok.training
    state = load_file(str(tokenizer))
    assert not any("teacher" in k for k in state)  # the teacher is not saved


def test_tokenizer_with_open_clip_teacher(data, tmp_path):
    """BEiT v2's teacher: an open_clip image tower (a tiny random one here, from a config
    file; a real one loads its weights from clip_pretrained)."""
    clip_cfg = tmp_path / "tiny-clip.json"
    clip_cfg.write_text(json.dumps({
        "embed_dim": 24,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
        "text_cfg": {"context_length": 8, "vocab_size": 100, "width": 16, "heads": 2, "layers": 1},
    }))
    task = {"name": "vq_tokenizer", "data_dir": str(data), **IMAGE, "num_codes": 32, "code_dim": 8,
            "decoder_depth": 1, "teacher": "clip", "clip_model": str(clip_cfg)}
    with pytest.warns(UserWarning, match="randomly initialised"):
        result = run(config(tmp_path, "clip", task, train={"steps": 2, "batch_size": 6}))
    assert result.status == "finished" and 0 < result.metrics["vq_tokenizer/codebook_usage"] <= 1
    assert 0 <= result.metrics["vq_tokenizer/rec_loss"] <= 2  # 1 - cosine
    bad = {**task, "clip_pretrained": str(tmp_path / "missing.bin")}
    with pytest.raises(ConfigError, match="clip_pretrained.*not found"):
        resolve(OmegaConf.create(config(tmp_path, "clip2", bad)))


def test_mim_loss_drops_on_a_fixed_batch(data, tokenizer, tmp_path):
    cfg, specs = resolve(OmegaConf.create(config(tmp_path, "mim", mim_task(data, tokenizer))))
    torch.manual_seed(0)
    model = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))
    task = model.tasks["mim"]
    ds = task.train_dataset()
    batch = task.collate([ds[i] for i in range(8)])
    assert batch["mask"].shape == (8, 16) and (batch["mask"].sum(1) <= 6).all() and batch["mask"].sum() >= 40
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    losses = []
    for _ in range(25):
        loss, logs = model("mim", batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses
    assert 0 <= float(logs["mim_acc"]) <= 1
    # the tokenizer is neither trained nor saved with the MIM weights
    assert not any("tokenizer" in k for k in model.state_dict())


def test_mim_then_finetune_loads_everything_but_the_head(data, tokenizer, tmp_path, capsys):
    mim = run(config(tmp_path, "mim", mim_task(data, tokenizer)))
    assert mim.status == "finished" and 0 <= mim.metrics["mim/mim_acc"] <= 1
    pretrained = mim.run_dir / "best" / "model.safetensors"
    source = load_file(str(pretrained))

    task = {"name": "classification", "data_dir": str(data), "num_classes": 3, **IMAGE, "scale": [0.5, 1.0],
            "crop_pct": 1.0}
    ft = config(tmp_path, "ft", task, init_from=str(pretrained),
                optim={"lr": 1e-3, "layer_decay": 0.65}, train={"steps": 2, "batch_size": 8})
    cfg, specs = resolve(OmegaConf.create(ft))
    capsys.readouterr()
    from foundation.engine.loop import build_model

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
    from tasks.classification.model import to_vit

    trained = checkpoint.load(result.run_dir / "best" / "model.safetensors").eval()
    vit = to_vit(trained).eval()
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(vit(x), trained.heads["classification"].logits(trained.backbone, x))
    assert set(result.metrics) == {"classification/top1", "classification/top5", "classification/loss"}
    assert result.metrics["classification/top5"] == 1.0  # 3 classes: top-5 is everything
    # from scratch: the same config without init_from
    scratch = run(ft, "init_from=null", "run_name=scratch")
    assert scratch.status == "finished"


def test_classification_pipeline_is_timms(data, tmp_path):
    task = {"name": "classification", "data_dir": str(data), "num_classes": 3, **IMAGE}
    cfg, specs = resolve(OmegaConf.create(config(tmp_path, "ft", task)))
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


def test_pos_embed_init_sincos_starts_from_the_2d_table(data, tmp_path):
    from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed

    task = {"name": "classification", "data_dir": str(data), "num_classes": 3, **IMAGE, "pos_embed_init": "sincos"}
    cfg, specs = resolve(OmegaConf.create(config(tmp_path, "ft", task)))
    head = specs[0].task(cfg.backbone).build_head()
    assert torch.allclose(head.pos_embed[0, 1:], build_sincos2d_pos_embed([4, 4], 32))
    assert head.pos_embed[0, 0].abs().max() < 0.1 and head.pos_embed.requires_grad  # class token row: 0.02 start
    with pytest.raises(ConfigError, match="field 'pos_embed_init': must be one of trunc_normal, sincos"):
        resolve(OmegaConf.create(config(tmp_path, "ft", {**task, "pos_embed_init": "zeros"})))


def test_tiny_recipe_keeps_the_whole_object(data):
    """The demo objects fill the frame: the tiny recipe's training transform only flips
    (a RandomResizedCrop of half the area cuts the silhouette, i.e. the label)."""
    cfg, specs = load_config(REPO / "configs" / "vision" / "tiny_finetune_magneto.yaml",
                             ["init_from=null", f"tasks.classification.data_dir={data}",
                              "tasks.classification.img_size=16", "tasks.classification.num_classes=3"])
    dataset = specs[0].task(cfg.backbone).train_dataset()
    image = dataset.load(0)[0].resize((16, 16))
    x = dataset.transform(image)
    ref = dataset.transform.transforms[-1](dataset.transform.transforms[-2](image))  # ToTensor, Normalize only
    assert torch.allclose(x, ref, atol=1e-6) or torch.allclose(x, ref.flip(-1), atol=1e-6)
    assert specs[0].task(cfg.backbone).mixup() is None and cfg.optim.layer_decay is None


def test_config_errors_name_the_field(data, tokenizer, tmp_path):
    task = {"name": "classification", "data_dir": str(data), "num_classes": 5, **IMAGE}
    with pytest.raises(ConfigError, match="field 'num_classes': 5, but .* has 3 class folders"):
        resolve(OmegaConf.create(config(tmp_path, "ft", task)))
    with pytest.raises(ConfigError, match="field 'tokenizer': not found"):
        resolve(OmegaConf.create(config(tmp_path, "mim", {**mim_task(data, tokenizer), "tokenizer": "nope"})))
    with pytest.raises(ConfigError, match="tokenizer.*encodes 16px images in 4px patches"):
        bad = {**mim_task(data, tokenizer), "img_size": 32, "num_masking_patches": 20}
        cfg, specs = resolve(OmegaConf.create(config(tmp_path, "mim", bad)))
        MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))
    with pytest.raises(ConfigError, match="masking: num_masking_patches must be in"):
        resolve(OmegaConf.create(config(tmp_path, "mim", {**mim_task(data, tokenizer), "num_masking_patches": 17})))


@pytest.mark.parametrize("name", ["tiny_tokenizer", "tiny_mim_magneto", "tiny_mim_preln", "tiny_finetune_magneto",
                                  "tiny_finetune_preln", "base_mim_magneto", "base_mim_preln", "large_mim_magneto",
                                  "large_mim_preln", "base_finetune_magneto", "base_finetune_preln",
                                  "large_finetune_magneto", "large_finetune_preln", "base_tokenizer"])
def test_shipped_configs_are_valid(name):
    cfg, specs = load_config(REPO / "configs" / "vision" / f"{name}.yaml", ["init_from=null"], check_data=False)
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


def test_compare_reads_final_evaluations(tmp_path):
    from tasks.mim.compare import final_eval, table

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"step": 100, "eval/classification/top1": 0.5}, {"step": 150, "loss": 1.0},
        {"step": 200, "eval/classification/top1": 0.4}]) + "\n")
    assert final_eval(run_dir, "classification/top1") is None  # not finished: no checkpoint pointer
    (run_dir / "last").write_text("ckpt/step_000200\n")
    assert final_eval(run_dir, "classification/top1") == 0.4  # the final evaluation, not the best
    results = {(n, i): [0.5, 0.25] for n in ("magneto", "preln") for i in ("scratch", "MIM")}
    text = table(results, [0, 1], "x")
    assert "| Magneto | MIM | 37.5 | 50.0 / 25.0 |" in text and "| Pre-LN (ViT) | scratch |" in text


def test_pixel_teacher_norm_pix():
    """norm_pix targets are each patch's pixels standardised: zero mean, unit variance,
    blind to the patch's brightness and contrast."""
    from tasks.vq_tokenizer.teacher import PixelTeacher, patchify

    images = torch.randn(2, 3, 16, 16)
    plain, normed = PixelTeacher(4)(images, (4, 4)), PixelTeacher(4, norm_pix=True)(images, (4, 4))
    assert torch.equal(plain, patchify(images, 4)) and normed.shape == (2, 16, 48)
    assert normed.mean(-1).abs().max() < 1e-5
    assert (normed.var(-1) - 1).abs().max() < 1e-3
    assert torch.allclose(PixelTeacher(4, norm_pix=True)(3 * images + 1, (4, 4)), normed, atol=1e-4)
