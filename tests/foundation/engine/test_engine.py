"""The training engine on CPU: exact resume, crash-safe checkpoints, layer decay, non-finite
steps, config errors, multi-task mixing and the CLI, all on the tiny seq2seq task."""
from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from foundation import checkpoint
from foundation.config import ConfigError
from foundation.engine import cli
from foundation.engine.run_state import Checkpointer
from foundation.engine.config import apply_override, load_config, resolve
from foundation.engine.data import ShardBatchSampler, TaskStream, step_plan
from foundation.engine.distributed import Env
from foundation.engine.loop import train
from foundation.engine.model import ModelConfig, MultiTaskModel
from foundation.engine.optim import build_optimizer, build_scheduler, layer_ids, lr_factor, param_groups
from support import read_records as records, run_config as run
from foundation_tasks.seq2seq.model import Seq2SeqHead

REPO = Path(__file__).resolve().parents[3]


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_config(tmp_path: Path, **sections) -> dict:
    cfg = {
        "run_name": "run",
        "output_dir": str(tmp_path),
        "seed": 0,
        "backbone": {"arch": "encoder_decoder", "dim": 32, "depth": 2, "heads": 4, "ffn_dim": 64},
        "tasks": [{"name": "seq2seq", "vocab_size": 8, "min_len": 3, "max_len": 6, "train_size": 64,
                   "eval_size": 16}],
        "optim": {"lr": 3e-3},
        "schedule": {"warmup_steps": 2},
        "train": {"steps": 8, "batch_size": 8},
        "eval": {"every": 0, "batch_size": 16},
        "save": {"every": 0, "keep": 2},
        "log": {"progress": False, "writers": ["jsonl"]},
    }
    for k, v in sections.items():
        cfg[k] = {**cfg.get(k, {}), **v} if isinstance(v, dict) else v
    return cfg


def train_losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(run_dir) if "loss" in r and "event" not in r}


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Checkpointer(run_dir, 1, Env(0, 1, 0, None, False)).latest() / "model.safetensors"))


# ---------------------------------------------------------------------------- resume


def test_resume_is_exact(tmp_path):
    """N steps straight == N/2, stop, resume, N/2: identical losses, weights, EMA and data
    position; with dropout (RNG state), gradient accumulation and epochs rolling over."""
    cfg = tiny_config(tmp_path, train={"steps": 12, "grad_accum": 2, "ema": 0.9},
                      backbone={"dropout": 0.1, "drop_path": 0.1}, save={"every": 6})
    straight = run(cfg, "run_name=straight")
    first = run(cfg, "run_name=split", "train.stop_at=6")
    assert first.status == "stopped" and first.step == 6
    assert json.loads((tmp_path / "split" / "status.json").read_text())["status"] == "stopped"
    second = run(cfg, "run_name=split", "resume=true")
    assert straight.status == second.status == "finished" and second.step == 12
    assert json.loads((tmp_path / "split" / "status.json").read_text())["status"] == "finished"

    a, b = train_losses(tmp_path / "straight"), train_losses(tmp_path / "split")
    assert sorted(a) == sorted(b) == list(range(1, 13))
    assert a == b  # bit-identical
    wa, wb = final_weights(tmp_path / "straight"), final_weights(tmp_path / "split")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    sa = torch.load(tmp_path / "straight/ckpt/step_000012/state.pt", weights_only=True)
    sb = torch.load(tmp_path / "split/ckpt/step_000012/state.pt", weights_only=True)
    assert sa["streams"] == sb["streams"] and sa["streams"]["seq2seq"]["epoch"] >= 2  # epochs rolled over
    assert all(torch.equal(sa["ema"][k], sb["ema"][k]) for k in sa["ema"])
    assert straight.metrics == second.metrics
    assert any(r.get("event") == "resume" and r["step"] == 6 for r in records(tmp_path / "split"))


def test_deterministic_kernels_for_the_run_only(tmp_path, monkeypatch):
    """``train.deterministic``: the run trains under ``torch.use_deterministic_algorithms``
    (warn-only), the same numbers as without on CPU, and the setting is put back after."""
    calls = []
    real = torch.use_deterministic_algorithms
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda on, **kw: calls.append(on) or real(on, **kw))
    cfg = tiny_config(tmp_path, train={"steps": 4})
    plain = run(cfg, "run_name=plain")
    det = run(cfg, "run_name=det", "train.deterministic=true")
    assert calls == [True, False] and not torch.are_deterministic_algorithms_enabled()
    assert det.status == plain.status == "finished"
    assert train_losses(tmp_path / "det") == train_losses(tmp_path / "plain")


def test_refuses_to_overwrite_a_run(tmp_path):
    cfg = tiny_config(tmp_path, train={"steps": 2})
    run(cfg)
    with pytest.raises(ConfigError, match="resume=true continues it"):
        run(cfg)
    assert run(cfg, "overwrite=true").status == "finished"


def test_kill_while_writing_a_checkpoint(tmp_path):
    """A process killed half-way through writing step 8 leaves step 4 loadable; resume
    then finishes the run and clears the debris."""
    cfg = tiny_config(tmp_path, train={"steps": 10}, save={"every": 4})
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    script = textwrap.dedent(f"""
        import json, os, torch
        from omegaconf import OmegaConf
        from foundation.engine import run_state
        from foundation.engine.config import resolve
        from foundation.engine.loop import train

        real_save = torch.save
        def dying_save(obj, path, *a, **k):
            if "step_000008" in str(path):  # half the state file, then the process is gone
                real_save(obj, path, *a, **k)
                size = os.path.getsize(path)
                with open(path, "r+b") as f:
                    f.truncate(size // 2)
                os._exit(9)
            return real_save(obj, path, *a, **k)
        run_state.torch.save = dying_save
        train(*resolve(OmegaConf.create(json.load(open({str(tmp_path / 'cfg.json')!r})))))
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 9, proc.stderr[-2000:]

    run_dir = tmp_path / "run"
    assert (run_dir / "ckpt" / ".tmp-step_000008").is_dir()  # the interrupted write
    assert (run_dir / "last").read_text().strip() == "ckpt/step_000004"
    latest = Checkpointer(run_dir, 2, Env(0, 1, 0, None, False)).latest()
    assert latest == run_dir / "ckpt" / "step_000004"
    model = checkpoint.load(latest / "model.safetensors")  # rebuilt from the file alone
    assert isinstance(model, MultiTaskModel)
    state = torch.load(latest / "state.pt", weights_only=True)
    assert state["step"] == 4

    result = run(cfg, "resume=true")
    assert result.status == "finished" and result.step == 10
    assert sorted(p.name for p in (run_dir / "ckpt").iterdir()) == ["step_000008", "step_000010"]


# ---------------------------------------------------------------------------- optimizer


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_layer_decay_learning_rates_are_applied(tmp_path):
    """The lr each block's parameters actually move by follows decay ** (L + 1 - layer_id):
    L = 4 blocks (2 encoder, 2 decoder); embeddings are layer 0, the output layer L + 1."""
    cfg, specs = resolve(tiny_config(tmp_path, optim={"lr": 1e-2, "layer_decay": 0.5, "weight_decay": 0.0},
                                     schedule={"name": "constant", "warmup_steps": 4}))
    torch.manual_seed(0)
    model = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))
    opt = build_optimizer(model, cfg.optim)
    sched = build_scheduler(opt, cfg.schedule, cfg.optim.lr, 10)
    ids, depth = layer_ids(model)
    assert depth == 4
    assert ids["heads.seq2seq.embed.tokens.weight"] == 0
    assert ids["backbone.encoder.layers.0.attn.qkv.weight"] == 1
    assert ids["backbone.decoder.layers.1.mlp.fc2.weight"] == 4
    assert ids["heads.seq2seq.out.weight"] == 5
    for _ in range(2):  # warmup step 2 of 4: factor 3/4
        sched.step()
    for group in opt.param_groups:
        expected = 1e-2 * 0.75 * 0.5 ** (depth + 1 - group["layer_id"])
        assert group["lr"] == pytest.approx(expected, rel=1e-12)

    # one real AdamW step: the first update of every weight is lr * g / (|g| + eps) ~ lr
    task = model.tasks["seq2seq"]
    batch = task.collate([task.train_dataset()[i] for i in range(8)])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model("seq2seq", batch)[0].backward()
    opt.step()
    lr_now = 1e-2 * 0.75
    for name, p in model.named_parameters():
        if name.endswith("weight") and p.ndim == 2 and "embed" not in name:  # dense, every entry has a gradient
            moved = (p.detach() - before[name]).abs().max().item()
            assert moved == pytest.approx(lr_now * 0.5 ** (depth + 1 - ids[name]), rel=1e-3), name


def test_the_optimizer_is_fused_and_updates_as_torchs_default_adamw(tmp_path):
    """On a CPU the engine's AdamW runs torch's fused kernel; over five steps of real
    gradients (weight decay, layer decay, bias / norm groups) it moves every parameter as
    torch's default (per-tensor loop) AdamW over the same groups does, to float rounding.
    The same gradients go to both: recomputing them on each copy would let rounding in
    near-zero gradients flip an Adam update's sign, which says nothing about the optimizer."""
    cfg, specs = resolve(tiny_config(tmp_path, optim={"lr": 1e-2, "layer_decay": 0.7, "weight_decay": 0.05}))
    torch.manual_seed(0)
    model = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))
    reference, start = copy.deepcopy(model), copy.deepcopy(model)
    opt = build_optimizer(model, cfg.optim)
    assert opt.defaults["fused"] is True
    ref_opt = torch.optim.AdamW(param_groups(reference, cfg.optim), lr=cfg.optim.lr, betas=tuple(cfg.optim.betas),
                                eps=cfg.optim.eps)
    assert not ref_opt.defaults["fused"]
    task = model.tasks["seq2seq"]
    for step in range(5):
        batch = task.collate([task.train_dataset()[i] for i in range(8 * step, 8 * step + 8)])
        opt.zero_grad()
        model("seq2seq", batch)[0].backward()
        for p, q in zip(model.parameters(), reference.parameters()):
            q.grad = p.grad.clone()
        opt.step()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    moved = max((p - q).abs().max().item() for p, q in zip(model.parameters(), start.parameters()))
    assert moved > 1e-2  # both really trained


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_freeze_pretrained_steps_trains_only_the_rest_first(tmp_path):
    """``optim.freeze_pretrained_steps`` N: the pretrained parameters keep their values for N
    real AdamW steps while the others train, then move at the schedule's lr of that step."""
    (tmp_path / "start.safetensors").touch()  # only the path is checked here
    cfg, specs = resolve(tiny_config(tmp_path, optim={"lr": 1e-2, "freeze_pretrained_steps": 2},
                                     init_from=str(tmp_path / "start.safetensors"),
                                     schedule={"name": "constant", "warmup_steps": 0}))
    torch.manual_seed(0)
    model = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))
    pretrained = {n for n, _ in model.named_parameters() if n.startswith("backbone.")}
    opt = build_optimizer(model, cfg.optim, pretrained=pretrained)
    sched = build_scheduler(opt, cfg.schedule, cfg.optim.lr, 10)
    assert opt.param_groups[-1].get("frozen_steps") is None  # the logged lr is one that trains
    task = model.tasks["seq2seq"]
    for step in range(3):
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        batch = task.collate([task.train_dataset()[i] for i in range(8 * step, 8 * step + 8)])
        opt.zero_grad()
        model("seq2seq", batch)[0].backward()
        opt.step()
        sched.step()
        moved = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
        if step < 2:
            assert moved and not moved & pretrained, step
        else:
            assert pretrained <= moved


def test_freeze_pretrained_steps_in_a_run(tmp_path):
    """In a run the held parameters are what ``init_from`` loaded: a run that loads every tensor
    and holds them for all its steps ends with the file's weights; without the hold it moves.
    Without init_from the setting changes nothing, bit for bit (one recipe for both starts)."""
    run(tiny_config(tmp_path / "a"))
    run(tiny_config(tmp_path / "s", optim={"freeze_pretrained_steps": 8}))
    assert train_losses(tmp_path / "a" / "run") == train_losses(tmp_path / "s" / "run")
    start = str(Checkpointer(tmp_path / "a" / "run", 1, Env(0, 1, 0, None, False)).latest() / "model.safetensors")
    held = run(tiny_config(tmp_path / "b", init_from=start, optim={"freeze_pretrained_steps": 8}))
    free = run(tiny_config(tmp_path / "c", init_from=start))
    assert held.status == free.status == "finished"
    a, b, c = (final_weights(tmp_path / d / "run") for d in "abc")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_schedules():
    from foundation.engine.config import ScheduleConfig

    f = lr_factor(ScheduleConfig(name="cosine", warmup_steps=10, min_lr=1e-4), 1e-3, 110)
    assert [f(s) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert f(10) == pytest.approx(1.0) and f(60) == pytest.approx(0.1 + 0.9 * 0.5) and f(110) == pytest.approx(0.1)
    lin = lr_factor(ScheduleConfig(name="linear"), 1.0, 100)
    poly = lr_factor(ScheduleConfig(name="poly", power=2.0), 1.0, 100)
    assert lin(50) == pytest.approx(0.5) and poly(50) == pytest.approx(0.25) and lin(100) == 0.0


# ---------------------------------------------------------------------------- non-finite


def _nan_at(monkeypatch, steps: set[int]):
    """The seq2seq loss becomes NaN on the given (1-based) training calls."""
    real = Seq2SeqHead.forward
    calls = {"n": 0}

    def forward(self, backbone, batch):
        calls["n"] += 1
        loss, logs = real(self, backbone, batch)
        return (loss * float("nan") if calls["n"] in steps else loss), logs

    monkeypatch.setattr(Seq2SeqHead, "forward", forward)


def test_nan_step_is_skipped_and_logged(tmp_path, monkeypatch):
    _nan_at(monkeypatch, {3})
    result = run(tiny_config(tmp_path, train={"steps": 5}))
    assert result.status == "finished" and result.nonfinite_total == 1
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["status"] == "finished" and status["step"] == 5 and status["nonfinite_total"] == 1
    recs = records(tmp_path / "run")
    event = next(r for r in recs if r.get("event") == "nonfinite")
    assert event["step"] == 3 and event["task"] == "seq2seq" and event["loss"] == "nan"
    skipped = [r for r in recs if r.get("skipped")]
    assert [r["step"] for r in skipped] == [3]
    assert all(math.isfinite(r["loss"]) for r in recs if "loss" in r and r["step"] != 3 and "event" not in r)


def test_nan_run_stops_cleanly(tmp_path, monkeypatch, capsys):
    """Non-finite losses from call 5 on, 3 allowed in a row: the run stops at step 7 with a
    message naming the step, the task and the last good checkpoint (step 4), exit code 1."""
    _nan_at(monkeypatch, set(range(5, 100)))
    path = tmp_path / "nan.yaml"
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(tiny_config(
        tmp_path, train={"steps": 20, "max_nonfinite": 3}, save={"every": 2}))))
    code = cli.train_main([str(path)])
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback" not in err
    ckpt = tmp_path / "run" / "ckpt" / "step_000004"
    assert "training stopped at step 7: 3 non-finite steps in a row" in err
    assert "task 'seq2seq'" in err and f"last good checkpoint: {ckpt}" in err
    diverged = [r for r in records(tmp_path / "run") if r.get("event") == "diverged"]
    assert len(diverged) == 1 and diverged[0]["step"] == 7 and diverged[0]["last_checkpoint"] == str(ckpt)
    status = json.loads((tmp_path / "run" / "status.json").read_text())  # what `foundation compare` reads
    assert status["status"] == "diverged" and status["step"] == 7 and status["steps"] == 20
    assert status["last_checkpoint"] == str(ckpt) and "training stopped at step 7" in status["message"]
    # the skipped steps did not touch the weights of the last good checkpoint
    assert not (tmp_path / "run" / "ckpt" / "step_000006").exists()


# ---------------------------------------------------------------------------- configs


@pytest.mark.parametrize("override, named", [
    ("optim.lrr=1", "optim.lrr"),
    ("train.steps=many", "train.steps"),
    ("train.mix=shuffle", "train.mix"),
    ("backbone.heads=5", "heads"),
    ("tasks.0.problem=copy", "problem"),
    ("tasks.seq2seq.colour=red", "colour"),
    ("tasks.0.data_dir=/no/such/dir", "/no/such/dir"),
    ("tasks.0.name=nosuchtask", "nosuchtask"),
    ("init_from=/no/such/file.safetensors", "init_from"),
])
def test_bad_config_fails_before_any_work(tmp_path, override, named, capsys):
    path = tmp_path / "cfg.yaml"
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(tiny_config(tmp_path))))
    with pytest.raises(ConfigError) as e:
        load_config(path, [override])
    assert named in str(e.value) and str(path) in str(e.value)
    assert cli.train_main([str(path), override]) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # nothing was started


def test_delete_override_removes_a_task_or_key(tmp_path):
    cfg = tiny_config(tmp_path)
    cfg["tasks"] = [{**cfg["tasks"][0], "id": "a"}, {**cfg["tasks"][0], "id": "b", "problem": "sort"}]
    cfg["optim"]["clip_grad"] = 5.0
    path = tmp_path / "cfg.yaml"
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    resolved, specs = load_config(path, ["~tasks.a", "~optim.clip_grad"])
    assert [s.id for s in specs] == ["b"] and specs[0].config.problem == "sort"
    assert resolved.optim.clip_grad == type(resolved.optim)().clip_grad  # back to the default
    assert [s.id for s in load_config(path, ["~tasks.1"])[1]] == ["a"]
    for bad, named in [("~tasks.c", "no task 'c'"), ("~optim.nosuch", "optim.nosuch"), ("~optim.lr=1", "~key")]:
        with pytest.raises(ConfigError, match=named):
            load_config(path, [bad])
    with pytest.raises(ConfigError, match="at least one task"):
        load_config(path, ["~tasks.a", "~tasks.b"])


def test_unknown_task_lists_known_ones(tmp_path):
    with pytest.raises(ConfigError) as e:
        resolve(tiny_config(tmp_path, tasks=[{"name": "nosuchtask"}]))
    assert "nosuchtask" in str(e.value) and "seq2seq" in str(e.value) and "tasks[0]" in str(e.value)


def test_data_dir_in_fairseq_layout(tmp_path):
    from foundation_tasks.seq2seq.data import main as write_data

    write_data([str(tmp_path / "data"), "--train-size", "64", "--valid-size", "16", "--vocab-size", "8",
                "--min-len", "3", "--max-len", "6"])
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["train.src", "train.tgt", "valid.src", "valid.tgt"]
    result = run(tiny_config(tmp_path, train={"steps": 2}), f"tasks.0.data_dir={tmp_path / 'data'}")
    assert result.status == "finished" and 0.0 <= result.metrics["seq2seq/token_accuracy"] <= 1.0


# ---------------------------------------------------------------------------- data and mixing


def test_shards_cover_the_global_batch():
    one = list(ShardBatchSampler(40, 8, 0, 1, seed=3, epoch=1))
    two = [list(ShardBatchSampler(40, 4, r, 2, seed=3, epoch=1)) for r in range(2)]
    assert len(one) == len(two[0]) == 5
    for g in range(5):
        assert sorted(one[g]) == sorted(two[0][g] + two[1][g])
    assert list(ShardBatchSampler(40, 8, 0, 1, seed=3, epoch=2)) != one  # a new order each epoch


def test_stream_resumes_mid_epoch():
    data = list(range(20))
    stream = TaskStream(data, list, batch_size=3, rank=0, world=1, seed=0)
    straight = [next(stream) for _ in range(15)]
    stream = TaskStream(data, list, batch_size=3, rank=0, world=1, seed=0)
    first = [next(stream) for _ in range(8)]
    state = stream.state_dict()
    again = TaskStream(data, list, batch_size=3, rank=0, world=1, seed=0)
    again.load_state_dict(state)
    assert first + [next(again) for _ in range(7)] == straight


def test_multitask_mixing(tmp_path):
    two = [
        {"name": "seq2seq", "id": "reverse", "weight": 1.0, "problem": "reverse", "vocab_size": 8, "max_len": 6,
         "train_size": 64, "eval_size": 8},
        {"name": "seq2seq", "id": "sort", "weight": 0.5, "problem": "sort", "vocab_size": 8, "max_len": 6,
         "train_size": 64, "eval_size": 8},
    ]
    result = run(tiny_config(tmp_path, tasks=two, train={"steps": 3}))
    first = records(tmp_path / "run")[0]
    assert first["loss"] == pytest.approx(first["loss/reverse"] + 0.5 * first["loss/sort"])
    assert {"reverse/exact_match", "sort/exact_match"} <= result.metrics.keys()
    run(tiny_config(tmp_path, tasks=two, train={"steps": 4, "mix": "round_robin"}), "run_name=rr")
    assert [[k for k in r if k.startswith("loss/")] for r in records(tmp_path / "rr") if "loss" in r] == \
        [["loss/reverse"], ["loss/sort"]] * 2
    plans = [step_plan("sample", ["a", "b"], [3.0, 1.0], s, seed=0) for s in range(400)]
    assert plans == [step_plan("sample", ["a", "b"], [3.0, 1.0], s, seed=0) for s in range(400)]
    share = sum(p[0][0] == "a" for p in plans) / 400
    assert 0.65 < share < 0.85


def test_init_from_loads_backbone(tmp_path, capsys):
    from foundation import Backbone

    cfg = tiny_config(tmp_path, train={"steps": 1})
    cfg_obj, _ = resolve(cfg)
    torch.manual_seed(5)
    pretrained = Backbone(cfg_obj.backbone)
    checkpoint.save(pretrained, tmp_path / "bb.safetensors")
    run(cfg, f"init_from={tmp_path / 'bb.safetensors'}", "optim.lr=1e-12", "optim.weight_decay=0")
    assert "missing 0; unexpected 0" in capsys.readouterr().out
    w = final_weights(tmp_path / "run")
    ref = pretrained.state_dict()["encoder.layers.0.attn.qkv.weight"]
    assert torch.allclose(w["backbone.encoder.layers.0.attn.qkv.weight"], ref, atol=1e-6)


# ---------------------------------------------------------------------------- the commands


def test_train_eval_plot_commands(tmp_path, capsys):
    path = tmp_path / "tiny.yaml"
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(tiny_config(
        tmp_path, train={"steps": 6}, eval={"every": 3}, save={"every": 3}, log={"writers": ["jsonl", "tensorboard", "csv"]}))))
    assert cli.train_main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "finished at step 6" in out and "seq2seq/exact_match" in out
    run_dir = tmp_path / "run"
    assert {"config.yaml", "metrics.jsonl", "tb", "ckpt", "best", "last"} <= {p.name for p in run_dir.iterdir()}
    assert sorted(p.name for p in (run_dir / "ckpt").iterdir()) == ["step_000003", "step_000006"]
    saved, _ = load_config(run_dir / "config.yaml")  # the resolved config is itself a valid config
    assert saved.train.steps == 6 and saved.tasks[0]["problem"] == "reverse"

    assert cli.eval_main([str(path), f"checkpoint={run_dir}", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    best = json.loads((run_dir / "best" / "metrics.json").read_text())
    assert metrics["seq2seq/exact_match"] == pytest.approx(best["metrics"]["seq2seq/exact_match"])

    from studies.plots import main as plot_main  # `foundation plot`

    assert plot_main([str(run_dir)]) == 0
    assert (run_dir / "curves.png").stat().st_size > 10_000

    assert cli.train_main([str(path), "--resume"]) == 0  # already done: nothing to do
    assert "nothing to do" in capsys.readouterr().out


# ---------------------------------------------------------------------------- DDP


def _ddp_worker(rank: int, world: int, init_file: str, cfg: dict) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:  # stopped half-way and resumed, in the same process group
        assert train(*resolve({**cfg, "train": {**cfg["train"], "stop_at": 3}})).status == "stopped"
        assert train(*resolve({**cfg, "resume": True})).status == "finished"
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_match_one(tmp_path, strategy):
    """2 gloo processes with batch 4 each = 1 process with batch 8: the same samples per
    step (each rank takes its half of the global batch), so the same losses and weights,
    with DDP and with FSDP2 (fully_shard) alike, stopped at step 3 and resumed."""
    import torch.multiprocessing as mp

    fixed = {**tiny_config(tmp_path)["tasks"][0], "min_len": 5, "max_len": 5}  # equal tokens per rank
    # no q/k/v biases: a key bias gets no gradient (softmax ignores it) but rounding noise,
    # which Adam scales up to a full lr-sized step whose sign differs between the two runs
    cfg = tiny_config(tmp_path, tasks=[fixed], train={"steps": 6, "grad_accum": 2}, eval={"batch_size": 4},
                      backbone={"qkv_bias": False},
                      # the guard measures on every rank and decides alike (FSDP refuses it with one line)
                      guard={"mode": "warn", "every": 1} if strategy == "ddp" else {})
    single = run(cfg, "run_name=one", "train.batch_size=8")
    ddp_cfg = OmegaConf.create(cfg)
    apply_override(ddp_cfg, "run_name=two")
    apply_override(ddp_cfg, "train.batch_size=4")
    apply_override(ddp_cfg, f"train.strategy={strategy}")
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "rendezvous"), OmegaConf.to_container(ddp_cfg)), nprocs=2,
             join=True)

    one, two = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert sorted(one) == sorted(two) == list(range(1, 7))
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-5, abs=1e-6)
    w1, w2 = final_weights(tmp_path / "one"), final_weights(tmp_path / "two")
    assert w1.keys() == w2.keys()
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=1e-5)
    ddp_eval = [r for r in records(tmp_path / "two") if "eval/seq2seq/loss" in r][-1]
    assert ddp_eval["eval/seq2seq/loss"] == pytest.approx(single.metrics["seq2seq/loss"], rel=1e-4)
    assert (tmp_path / "two" / "ckpt" / "step_000006" / "rng_rank1.pt").is_file()
    if strategy == "ddp":
        assert any("update/output" in r for r in records(tmp_path / "two"))
    state = torch.load(tmp_path / "two" / "ckpt" / "step_000006" / "state.pt", weights_only=True)
    assert state["world"] == 2 and state["samples"] == 6 * 8 * 2


def test_backbone_section_derives_its_own_defaults():
    """A backbone section without ffn_dim gets 4 * its own dim, not the default section's 3072."""
    cfg, _ = resolve({"backbone": {"dim": 32, "depth": 2, "heads": 4, "arch": "encoder_decoder"},
                      "tasks": [{"name": "seq2seq", "vocab_size": 16}]}, check_data=False)
    assert cfg.backbone.ffn_dim == 128
    cfg, _ = resolve({"backbone": {"dim": 32, "depth": 2, "heads": 4, "ffn_dim": 48, "arch": "encoder_decoder"},
                      "tasks": [{"name": "seq2seq", "vocab_size": 16}]}, check_data=False)
    assert cfg.backbone.ffn_dim == 48


def test_known_tasks_are_tasks_not_common_packages():
    from foundation.engine.task import known_tasks

    names = known_tasks()
    assert {"classification", "asr", "vqa", "segmentation"} <= set(names)
    assert not [n for n in names if n.endswith("_common")], names
    with pytest.raises(ConfigError, match="known tasks: .*classification") as e:
        from foundation.engine.task import get_task
        get_task("no_such_task")
    assert "vl_common" not in str(e.value)
