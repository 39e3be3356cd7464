"""The DeepNet model-update probe (studies/probe.py)."""
import csv
import math

import pytest
import torch

from studies.probe import main, model_update, reversal_batch, trace_update

TINY = dict(batch=8, length=8, vocab=16)


pytestmark = pytest.mark.usefixtures("one_thread")


def test_update_per_step_is_finite_and_starts_at_zero():
    tr = trace_update("magneto", 2, steps=3, lr=1e-4, **TINY)
    assert len(tr.updates) == 4 and len(tr.losses) == 3
    assert tr.updates[0] == 0.0
    assert all(math.isfinite(u) and u > 0 for u in tr.updates[1:])
    assert all(math.isfinite(x) for x in tr.losses)


def test_same_seed_same_updates():
    a = model_update("deepnorm", 1, steps=2, seed=3, **TINY)
    b = model_update("deepnorm", 1, steps=2, seed=3, **TINY)
    assert a == b


def test_reversal_batch_is_reversed_and_shifted():
    src, tgt_in, tgt = reversal_batch(torch.Generator().manual_seed(0), 4, 6, 16)
    assert torch.equal(tgt, src.flip(1))
    assert torch.equal(tgt_in[:, 1:], tgt[:, :-1]) and (tgt_in[:, 0] == 1).all()
    assert src.min() >= 2 and src.max() < 16


@pytest.mark.parametrize("seed", [0, 1])
def test_postln_update_grows_with_depth_and_deepnorm_bounds_it(seed):
    """DeepNet Fig. 4 in miniature. Measured over seeds 0-13 (3 Adam steps at lr 5e-5):
    postln 24L / postln 2L from 2.3x to 12.9x (seeds 0, 1: 6.2x, 4.1x) and postln 24L /
    deepnorm 24L from 4.2x to 13.8x (seeds 0, 1: 7.2x, 5.3x); asserted at 1.5x and 2.5x."""
    kw = dict(steps=3, lr=5e-5, optimizer="adam", train_ln=True, seed=seed, **TINY)
    post_deep = max(model_update("postln", 24, **kw))
    post_shallow = max(model_update("postln", 2, **kw))
    deepnorm_deep = max(model_update("deepnorm", 24, **kw))
    assert post_deep > 1.5 * post_shallow
    assert post_deep > 2.5 * deepnorm_deep


def test_deepnorm_update_is_flat_in_the_theorem_setting():
    """Plain SGD with LayerNorm affine frozen (the papers' analysis): DeepNorm's first
    updates do not grow with depth while Post-LN's do. Seeds 0-5: DeepNorm 24L/2L 0.85-1.28x,
    Post-LN 24L/2L 3.3-7.6x."""
    kw = dict(steps=2, seed=0, **TINY)  # defaults: sgd, lr 5e-3, LayerNorm frozen
    deep, shallow = max(model_update("deepnorm", 24, **kw)), max(model_update("deepnorm", 2, **kw))
    assert 0.5 < deep / shallow < 1.5
    assert max(model_update("postln", 24, **kw)) > 2 * max(model_update("postln", 2, **kw))


def test_cli_writes_table_csv_and_plot(tmp_path, capsys):
    out = tmp_path / "probe"
    rc = main(["--norms", "postln,deepnorm", "--depths", "1,2", "--steps", "2", "--batch", "4",
               "--length", "6", "--vocab", "12", "--out", str(out)])
    assert rc == 0
    rows = list(csv.DictReader((out / "updates.csv").open()))
    assert len(rows) == 2 * 2 * 3  # norms x depths x (steps + 1)
    assert {r["norm"] for r in rows} == {"postln", "deepnorm"}
    assert float(rows[0]["update"]) == 0.0
    table = (out / "updates.md").read_text()
    assert "| deepnorm | 2L-2L |" in table
    assert (out / "update.png").stat().st_size > 1000
    assert "| postln | 1L-1L |" in capsys.readouterr().out


def test_cli_rejects_unknown_norm(tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["--norms", "rmsnorm", "--out", str(tmp_path)])
    assert e.value.code == 2
