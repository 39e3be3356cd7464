"""The VQ-KD tokenizer through the engine on tiny data: pixel and open_clip teachers, codebook
usage; the frozen tokenizer MIM loads; the pixel teacher's targets."""
from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from foundation.config import ConfigError
from foundation.engine.config import resolve
from foundation_tasks.vision_common.tokenizer import load_tokenizer

IMAGE = {"img_size": 16, "patch_size": 4}


pytestmark = pytest.mark.usefixtures("one_thread")


def test_tokenizer_trains_and_reports_codebook_usage(vision_tokenizer, run_records):
    run_dir = vision_tokenizer.parents[1]
    recs = run_records(run_dir)
    train_recs = [r for r in recs if "vq_tokenizer/codes_in_batch" in r]
    assert train_recs and all(0 < r["vq_tokenizer/codes_in_batch"] <= 1 for r in train_recs)
    final = [r for r in recs if "eval/vq_tokenizer/codebook_usage" in r][-1]
    assert 0 < final["eval/vq_tokenizer/codebook_usage"] <= 1
    assert 1 <= final["eval/vq_tokenizer/perplexity"] <= 64
    assert final["eval/vq_tokenizer/rec_loss"] > 0
    tok = load_tokenizer(vision_tokenizer)  # frozen: encodes, never updates its codebook
    images = torch.randn(2, 3, 16, 16)
    before = tok.head.quantize.codebook.clone()
    tok.train()
    ids = tok(images)
    assert ids.shape == (2, 16) and ids.dtype == torch.long and ids.max() < 64
    assert torch.equal(before, tok.head.quantize.codebook) and not tok.training
    state = load_file(str(vision_tokenizer))
    assert not any("teacher" in k for k in state)  # the teacher is not saved


def test_tokenizer_with_open_clip_teacher(vision_data, tmp_path, vision_config, run_config):
    """BEiT v2's teacher: an open_clip image tower (a tiny random one here, from a config
    file; a real one loads its weights from clip_pretrained)."""
    clip_cfg = tmp_path / "tiny-clip.json"
    clip_cfg.write_text(json.dumps({
        "embed_dim": 24,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
        "text_cfg": {"context_length": 8, "vocab_size": 100, "width": 16, "heads": 2, "layers": 1},
    }))
    task = {"name": "vq_tokenizer", "data_dir": str(vision_data), **IMAGE, "num_codes": 32, "code_dim": 8,
            "decoder_depth": 1, "teacher": "clip", "clip_model": str(clip_cfg)}
    with pytest.warns(UserWarning, match="randomly initialised"):
        result = run_config(vision_config(tmp_path, "clip", task, train={"steps": 2, "batch_size": 6}))
    assert result.status == "finished" and 0 < result.metrics["vq_tokenizer/codebook_usage"] <= 1
    assert 0 <= result.metrics["vq_tokenizer/rec_loss"] <= 2  # 1 - cosine
    bad = {**task, "clip_pretrained": str(tmp_path / "missing.bin")}
    with pytest.raises(ConfigError, match="clip_pretrained.*not found"):
        resolve(OmegaConf.create(vision_config(tmp_path, "clip2", bad)))


def test_pixel_teacher_norm_pix():
    """norm_pix targets are each patch's pixels standardised: zero mean, unit variance,
    blind to the patch's brightness and contrast."""
    from foundation_tasks.vq_tokenizer.teacher import PixelTeacher
    from foundation_tasks.vision_common.pixels import patchify

    images = torch.randn(2, 3, 16, 16)
    plain, normed = PixelTeacher(4)(images, (4, 4)), PixelTeacher(4, norm_pix=True)(images, (4, 4))
    assert torch.equal(plain, patchify(images, 4)) and normed.shape == (2, 16, 48)
    assert normed.mean(-1).abs().max() < 1e-5
    assert (normed.var(-1) - 1).abs().max() < 1e-3
    assert torch.allclose(PixelTeacher(4, norm_pix=True)(3 * images + 1, (4, 4)), normed, atol=1e-4)


def test_tokenizer_with_a_teacher_trained_here(vision_data, vision_tokenizer, tmp_path, vision_config, run_config):
    """teacher: run distils a frozen ViT from one of our vision runs (here the tokenizer
    fixture's encoder): the targets are its final-normed patch tokens, the teacher gets no
    gradient and is not saved."""
    from foundation_tasks.vision_common.tokenizer import load_tokenizer
    from foundation_tasks.vq_tokenizer.teacher import RunTeacher

    teacher = RunTeacher(str(vision_tokenizer), **IMAGE)
    tok = load_tokenizer(vision_tokenizer)
    images = torch.randn(3, 3, 16, 16)
    with torch.no_grad():  # the teacher's targets are the run's encoder output, patch tokens only
        expected = tok.backbone(tok.head.embed(images)[0])[:, 1:]
    target = teacher(images, (4, 4))
    assert target.shape == (3, 16, teacher.out_dim) and torch.allclose(target, expected, atol=1e-6)
    assert not any(p.requires_grad for p in teacher.parameters()) and not teacher.train().training
    task = {"name": "vq_tokenizer", "data_dir": str(vision_data), **IMAGE, "num_codes": 32, "code_dim": 8,
            "decoder_depth": 1, "teacher": "run", "teacher_run": str(vision_tokenizer)}
    result = run_config(vision_config(tmp_path, "run-teacher", task, train={"steps": 2, "batch_size": 6}))
    assert result.status == "finished" and 0 <= result.metrics["vq_tokenizer/rec_loss"] <= 2  # 1 - cosine
    state = load_file(str(result.run_dir / "best" / "model.safetensors"))
    assert state["heads.vq_tokenizer.decode_task_layer.2.weight"].shape[0] == teacher.out_dim
    assert not any("teacher" in k for k in state)
    with pytest.raises(ConfigError, match="teacher_run.*not found"):
        resolve(OmegaConf.create(vision_config(tmp_path, "run2", {**task, "teacher_run": str(tmp_path / "no.safetensors")})))
    with pytest.raises(ConfigError, match="teacher_run"):
        resolve(OmegaConf.create(vision_config(tmp_path, "run3", {**task, "teacher_run": None})))
