"""BEST-RQ: the frozen, seeded quantizer; span masking as configured; targets and masks of
the data; the loss drops on a fixed batch; a run evaluates and resumes with the same
quantizer (cross-modal pretraining with it: tests/foundation_tasks/test_crossmodal.py)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from foundation import checkpoint
from foundation.engine.config import OptimConfig, resolve
from foundation.engine.loop import train
from foundation.engine.model import ModelConfig, MultiTaskModel
from foundation.engine.optim import build_optimizer
from foundation_tasks.best_rq.data import span_mask
from foundation_tasks.best_rq.model import STACK, stack_frames
from foundation_tasks.best_rq.quantizer import RandomProjectionQuantizer
from support import overfit_losses

BACKBONE = {"dim": 16, "depth": 2, "heads": 2, "ffn_dim": 32, "rel_pos": "1d"}
ENGINE = {"log": {"progress": False, "writers": ["jsonl"]}, "optim": {"lr": 2e-3}, "eval": {"max_batches": 2}}

pytestmark = pytest.mark.usefixtures("one_thread")


def build(tasks: list[dict]) -> MultiTaskModel:
    """A seeded model of the tiny backbone; resolving checks the data (writes the CMVN statistics)."""
    cfg, specs = resolve({"backbone": BACKBONE, "tasks": tasks}, check_data=True)
    torch.manual_seed(0)
    return MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))


def test_quantizer_is_the_nearest_normalised_code_and_seeded():
    q = RandomProjectionQuantizer(4 * 10, code_dim=8, vocab_size=50, num_codebooks=2, seed=3)
    x = torch.randn(3, 7, 40)
    ids = q(x)
    assert ids.shape == (3, 7, 2) and ids.dtype == torch.long
    for k in range(2):  # brute force: l2 distance between the normalised projection and the unit codes
        y = F.normalize(x.reshape(-1, 40) @ q.projection[k], dim=-1)
        assert torch.allclose(q.codebook[k].norm(dim=-1), torch.ones(50))
        assert torch.equal(torch.cdist(y, q.codebook[k]).argmin(-1), ids[..., k].reshape(-1))
    # Xavier-uniform projection, N(0, 1) codebook before normalisation: the seed alone decides both
    assert q.projection.abs().max() <= math.sqrt(6 / (40 + 8))
    torch.manual_seed(123)  # the global RNG plays no part
    same, other = RandomProjectionQuantizer(40, 8, 50, 2, seed=3), RandomProjectionQuantizer(40, 8, 50, 2, seed=4)
    assert torch.equal(same.projection, q.projection) and torch.equal(same.codebook, q.codebook)
    assert not torch.equal(other.codebook, q.codebook)
    assert list(q.parameters()) == [] and {n for n, _ in q.named_buffers()} == {"projection", "codebook"}


@pytest.mark.parametrize("prob,span", [(0.01, 40), (0.05, 10)])
def test_span_mask_statistics_match_the_config(prob, span):
    rng = np.random.default_rng(0)
    masks = [span_mask(4000, prob, span, rng) for _ in range(20)]
    ratio = np.mean([m[span:-span].mean() for m in masks])  # away from the edges
    assert ratio == pytest.approx(1 - (1 - prob) ** span, abs=0.02)
    runs = []  # (start, length) of the masked runs not cut by the end
    for m in masks:
        edges = np.flatnonzero(np.diff(np.r_[0, m.astype(int), 0]))
        runs += [(a, b - a) for a, b in zip(edges[::2], edges[1::2]) if b < len(m)]
    assert len(runs) > 100 and min(n for _, n in runs) >= span  # whole spans (joined when they overlap)


def test_best_rq_data_masks_targets_and_frozen_quantizer(speech, best_rq_spec):
    model = build([best_rq_spec()])  # check() writes the CMVN statistics
    task, head = model.tasks["speech"], model.heads["speech"]
    assert (Path(speech) / "prep/train/feats_stats_fbank80.npz").is_file()  # the file the asr task reads too
    assert head.cmvn.frames > 0
    # the quantizer: buffers, no gradients, not in the optimizer, in the checkpoint
    opt = build_optimizer(model, OptimConfig())
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    assert not any(id(b) in in_opt for b in head.quantizer.buffers())
    assert list(head.quantizer.parameters()) == []
    state = model.state_dict()
    assert {"heads.speech.quantizer.projection", "heads.speech.quantizer.codebook"} <= state.keys()
    # masks: fixed for evaluation, redrawn for training; ~1 - 0.95^10 of the frames
    ev = task.eval_dataset()
    assert all(torch.equal(ev[i][1], ev[i][1]) for i in range(len(ev)))
    tr = task.train_dataset()
    assert not all(torch.equal(tr[0][1], tr[0][1]) for _ in range(5))
    ratio = torch.cat([tr[i][1] for i in range(len(tr)) for _ in range(5)]).float().mean()
    assert 0.25 < ratio < 0.5, ratio
    # one target per encoder frame (4 stacked frames), only masked frames scored
    batch = task.collate([tr[i] for i in range(4)])
    logits, targets, chosen = head.predict(model.backbone, batch)
    L = batch["feats"].shape[1]
    assert chosen.shape == (4, -(-L // STACK)) and logits.shape == (int(chosen.sum()), 1, 64)
    x = head.cmvn(batch["feats"], batch["feat_lens"])
    assert torch.equal(targets, head.quantizer(stack_frames(x))[chosen])


def test_best_rq_loss_drops_on_a_fixed_batch(best_rq_spec):
    model = build([best_rq_spec()])
    task = model.tasks["speech"]
    data = task.train_dataset()
    batch = task.collate([data[i] for i in range(6)])
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    losses, _ = overfit_losses(model, "speech", batch, opt, 60)
    assert losses[0] == pytest.approx(math.log(64), rel=0.2)  # chance at the start
    assert np.mean(losses[-5:]) < 0.6 * losses[0], losses  # (about 0.5 here)


def test_best_rq_run_evaluates_and_resumes_with_the_same_quantizer(best_rq_spec, tmp_path):
    cfg = {**ENGINE, "run_name": "rq", "output_dir": str(tmp_path), "backbone": BACKBONE,
           "tasks": [best_rq_spec()], "train": {"steps": 3, "batch_size": 4, "stop_at": 2}}
    first = train(*resolve(cfg))
    assert first.status == "stopped"
    result = train(*resolve({**cfg, "resume": True, "train": {**cfg["train"], "stop_at": None}}))
    assert result.status == "finished"
    assert {"speech/accuracy", "speech/loss", "speech/mask_ratio"} <= result.metrics.keys()
    assert 0.2 < result.metrics["speech/mask_ratio"] < 0.6
    fresh = RandomProjectionQuantizer(4 * 80, 8, 64, seed=0)
    for step in ("step_000002", "step_000003"):
        saved = load_file(str(tmp_path / "rq/ckpt" / step / "model.safetensors"))
        assert torch.equal(saved["heads.speech.quantizer.codebook"], fresh.codebook)
        assert torch.equal(saved["heads.speech.quantizer.projection"], fresh.projection)
    # the checkpoint, not the seed, is what a loaded model uses
    model = checkpoint.load(tmp_path / "rq/best/model.safetensors")
    assert torch.equal(model.heads["speech"].quantizer.codebook, fresh.codebook)
