"""The stability guard (engine/guard.py): the model-update measurement checked by hand, the
rule's episodes, measuring changes nothing, a run forced to diverge is warned about, rolled
back and finished with a lower learning rate; a blown-up run ends "diverged"."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from foundation.config import ConfigError
from foundation.engine.config import resolve
from foundation.engine.blowup import LossWatch
from foundation.engine.guard import UpdateMonitor
from foundation.engine.guard_rules import Guard
from foundation.engine.loop import build_model, train

from support import read_records

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from test_engine import final_weights, tiny_config  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def probe_model(tmp_path: Path):
    cfg, specs = resolve(tiny_config(tmp_path))
    model = build_model(cfg, specs, log=lambda s: None)
    task = model.tasks["seq2seq"]
    data = task.train_dataset()
    return model, task.collate([data[i] for i in range(4)])


def test_update_monitor_measures_relative_changes_and_touches_nothing(tmp_path):
    model, batch = probe_model(tmp_path)
    monitor = UpdateMonitor(model, "seq2seq", batch)
    assert len(monitor.blocks) == 4 and len(monitor.ends) == 2  # encoder and decoder, 2 blocks each
    model.train()
    monitor.blocks[2].eval()  # a part kept in eval (a frozen teacher) stays so; the probe runs all in eval
    seen = []
    hook = monitor.blocks[0].register_forward_hook(lambda m, *a: seen.append(m.training))
    rng = torch.get_rng_state()
    assert monitor.measure() == {}  # the reference
    hook.remove()
    assert torch.equal(torch.get_rng_state(), rng) and model.training and seen == [False]
    assert [m.training for m in monitor.blocks] == [True, True, False, True]
    monitor.blocks[2].train()
    with torch.no_grad():
        for p in monitor.blocks[1].parameters():
            p.mul_(1.1)  # block 1 moves by exactly 10 % of its norm
    m = monitor.measure()
    assert m["update/block1"] == pytest.approx(0.1, rel=1e-5) and m["update/weights_max"] == m["update/block1"]
    assert m["update/block0"] == m["update/block2"] == m["update/block3"] == 0
    assert m["update/output"] > 0
    again = monitor.measure()  # nothing moved since
    assert again["update/output"] == 0 and again["update/weights_max"] == 0


def test_the_probe_forward_stops_after_the_last_end_block(tmp_path):
    """After the first measurement the probe forward ends at the end blocks' last call: the head (and its
    loss) no longer run, and the outputs are the whole forward's, bit for bit, after the model moved too."""
    model, batch = probe_model(tmp_path)
    monitor = UpdateMonitor(model, "seq2seq", batch)
    after_ends: list[int] = []  # leaf modules called, as a count
    leaves = [m for m in model.modules() if not list(m.children())]
    hooks = [m.register_forward_hook(lambda *a: after_ends.append(1)) for m in leaves]
    first = monitor.output()
    assert monitor.calls == 2  # the encoder's last block, then the decoder's
    calls_whole = len(after_ends)
    after_ends.clear()
    assert torch.equal(monitor.output(), first) and 0 < len(after_ends) < calls_whole  # stopped early
    with torch.no_grad():
        for p in monitor.blocks[0].parameters():
            p.mul_(1.05)
    stopped = monitor.output()
    for h in hooks:
        h.remove()
    monitor.calls = None  # the whole forward again
    assert torch.equal(stopped, monitor.output())


def test_guard_fires_above_its_recent_level_once_per_episode():
    guard = Guard(factor=4.0, window=10, warmup=5)
    assert all(guard.check(s, 0.1, lr=0.1) is None for s in range(10))  # rate 1 a unit of lr
    first = guard.check(10, 0.5, lr=0.1)
    assert first is not None and first["new_episode"] and first["level"] == 1.0
    assert guard.check(11, 0.6, lr=0.1)["new_episode"] is False  # the same episode
    assert guard.check(12, 0.35, lr=0.1) is None  # 3.5x: under the threshold, still the same episode
    assert guard.check(13, 0.45, lr=0.1)["new_episode"] is False  # so this is no new warning
    assert guard.check(14, 0.15, lr=0.1) is None  # 1.5x, under sqrt(4) x the level: the episode ends
    assert guard.check(15, 1.0, lr=0.2)["new_episode"]  # per unit of lr: 5x
    assert guard.check(16, 0.15, lr=0.1) is None
    assert list(guard.recent)[-3:] == pytest.approx([1.0, 1.5, 0.75])  # nothing read inside an episode entered it


def diverging(tmp_path: Path, mode: str, eval: dict | None = None, save: dict | None = None, **guard) -> dict:
    """Tiny seq2seq warmed up to lr 1.5 without clipping: healthy for ~35 steps, then blows up."""
    return tiny_config(tmp_path / mode, optim={"lr": 1.5, "clip_grad": None}, schedule={"warmup_steps": 100},
                       train={"steps": 100}, guard={"mode": mode, "every": 1, "warmup": 5, "window": 20, "snapshot_every": 2,
                                                     "attention": 0.2, **guard}, eval=eval or {}, save=save or {})


def losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in read_records(run_dir) if "loss" in r and "event" not in r]


def test_a_diverging_run_is_warned_about_ends_diverged_and_measuring_changes_nothing(tmp_path, capsys):
    off = train(resolve(diverging(tmp_path, "off"))[0])
    assert off.status == "diverged" and "blew up" in off.message
    assert not (off.run_dir / "best").exists() and not any((off.run_dir / "ckpt").glob("*"))  # nothing saved
    status = json.loads((off.run_dir / "status.json").read_text())
    assert status["status"] == "diverged" and status["guard"] == {"mode": "off"}
    # evaluated and saved every 100 steps, its last: the blown-up model is not evaluated, saved or kept as best
    due = train(resolve(diverging(tmp_path / "due", "off", attention=0, eval={"every": 100}, save={"every": 100}))[0])
    assert due.status == "diverged" and due.metrics == {} and due.last_checkpoint is None and due.best_step is None
    assert not (due.run_dir / "best").exists() and not any((due.run_dir / "ckpt").glob("*"))
    # evaluated and saved every 25 steps, one checkpoint kept: one taken mid-blow-up (steps 50, 75) would replace
    # the good one, and become best/ where its metric reads better (token accuracy 0.100 at 75 against 0.075 at 25)
    mid = train(resolve(diverging(tmp_path / "mid", "off", attention=0, save={"every": 25, "keep": 1},
                                  eval={"every": 25, "best": "seq2seq/token_accuracy"}))[0])
    assert mid.status == "diverged" and mid.best_step == 25
    assert mid.last_checkpoint.name == "step_000025" and [p.name for p in (mid.run_dir / "ckpt").iterdir()] == ["step_000025"]
    evals = {r["step"]: r for r in read_records(mid.run_dir) if "eval/seq2seq/loss" in r}
    assert sorted(evals) == [25, 50, 75]  # on the record all the same
    assert "step 50: the training loss is blown up" in capsys.readouterr().err
    warn = train(resolve(diverging(tmp_path, "warn"))[0])
    assert warn.status == "diverged"
    assert losses(warn.run_dir) == losses(off.run_dir)  # the measurement does not touch training
    events = [r for r in read_records(warn.run_dir) if r.get("event") == "guard"]
    blow_up = next(i for i, v in enumerate(losses(off.run_dir), 1) if v > 2 * losses(off.run_dir)[0])
    assert events and all(e["action"] == "warn" for e in events)
    # the attention sharpens from the first steps, ~30 before the blow-up; the model update jumps before it too
    by_signal = {e["signal"]: e["step"] for e in events}
    assert by_signal["attention"] + 20 <= blow_up and by_signal["update"] < blow_up
    # the loss keeps climbing for 60 steps, dipping now and then: one warning per signal, not one per dip
    assert len(events) == len(by_signal)
    err = capsys.readouterr().err
    assert f"guard: step {by_signal['attention']}: the largest attention logit grew" in err
    assert f"guard: step {by_signal['update']}: the model update jumped" in err
    records = read_records(warn.run_dir)
    assert any("update/output" in r for r in records) and any("attention/logit_max" in r for r in records)
    quiet = train(resolve(diverging(tmp_path / "no-attention", "warn", attention=0))[0])  # the default
    assert losses(quiet.run_dir) == losses(off.run_dir)
    assert "attention" not in {r.get("signal") for r in read_records(quiet.run_dir) if r.get("event") == "guard"}


def test_the_blow_up_rule_judges_a_new_phase_against_its_own_first_loss():
    """The ASR head adds its transducer loss to CTC mid-run (``asr/phase`` 0 -> 1): the jump is a new
    objective, as the studies judge it, not a blow-up; a blow-up inside the new phase still is one."""
    ctc, both = (("asr/phase", 0.0),), (("asr/phase", 1.0),)
    watch, plain = LossWatch(2.0, 100), LossWatch(2.0, 100)  # a window of 5 steps
    for loss, phase in [(20.0, ctc), (14.0, ctc), (12.0, ctc), *[(v, both) for v in (60.0, 70.0, 55.0, 60.0, 58.0)]]:
        watch.add(loss, phase)
        plain.add(loss)
    assert watch.above() is None and watch.blown_up() is None
    assert plain.above() is not None  # 60.6 against the first CTC loss, 20
    watch.add(9.0, ())  # a step of another task (train.mix) changes no phase
    resumed = LossWatch(2.0, 100)
    resumed.load_state_dict(watch.state_dict())
    for w in (watch, resumed):
        for _ in range(5):
            w.add(130.0, both)
        assert w.blown_up() == ("the training loss blew up and did not come back: 130 over the last 5 steps "
                                "against 60 at the first (train.explode_factor=2)")


def test_the_blow_up_rule_forgets_the_losses_of_steps_rolled_back(tmp_path):
    # the loss rule alone (the update rule's factor out of reach) rolls back at step 44 to the step-30 snapshot,
    # two steps before the end: the losses 42-44 (6.2, 13.6, 11.4) belong to weights no longer there
    cfg = diverging(tmp_path, "recover", attention=0, factor=1000.0, snapshot_every=10)
    cfg["train"]["steps"] = 46
    result = train(resolve(cfg)[0])
    assert result.status == "finished" and max(losses(result.run_dir)[-2:]) < 2.6  # was "diverged": 7.18 over 5 steps
    actions = json.loads((result.run_dir / "status.json").read_text())["guard"]["actions"]
    assert [(a["step"], a["signal"], a["rolled_back_to"]) for a in actions] == [(44, "loss", 30)]
    watch = LossWatch(2.0, 1400)  # a window of 70 steps, as the tiny ASR recipe's
    for _ in range(60):
        watch.add(2.0)
    watch.add(1e4)  # one spike: the loss rule's recover rolls back to a good snapshot
    assert watch.above() is not None
    watch.rolled_back()
    watch.add(2.1)
    assert watch.above() is None and watch.first == 2.0


def test_recover_rolls_the_weights_ema_back_with_the_model(tmp_path, monkeypatch):
    """train.ema is training state too: after the rollback at step 44 to the step-30 snapshot, the EMA
    goes on from its step-30 value, not from one that averaged the blown-up weights of steps 31-44."""
    from foundation.engine import loop

    decay, seen = 0.99, {}
    original = loop.Trainer.train_step

    def step(trainer):
        record = original(trainer)
        if trainer.step in (30, 45):
            seen[trainer.step] = ({k: v.clone() for k, v in trainer.ema.shadow.items()},
                                  {k: v.detach().clone() for k, v in trainer.model.state_dict().items()})
        return record

    monkeypatch.setattr(loop.Trainer, "train_step", step)
    cfg = diverging(tmp_path, "recover", attention=0, factor=1000.0, snapshot_every=10)
    cfg["train"].update(steps=46, ema=decay)
    result = train(resolve(cfg)[0])
    actions = json.loads((result.run_dir / "status.json").read_text())["guard"]["actions"]
    assert [(a["step"], a["rolled_back_to"]) for a in actions] == [(44, 30)]
    (ema30, _), (ema45, weights45) = seen[30], seen[45]
    for k, v in ema45.items():
        if v.is_floating_point():  # one EMA update from the restored average: ema30 + (1 - decay) (w45 - ema30)
            torch.testing.assert_close(v, ema30[k].lerp(weights45[k], 1 - decay), rtol=1e-5, atol=1e-6)


def test_recover_rolls_back_lowers_the_lr_and_finishes(tmp_path):
    result = train(resolve(diverging(tmp_path, "recover"))[0])
    assert result.status == "finished"
    assert max(losses(result.run_dir)[-20:]) < losses(result.run_dir)[0]
    status = json.loads((result.run_dir / "status.json").read_text())
    recoveries = [a for a in status["guard"]["actions"] if a["action"] == "recover"]
    assert recoveries and status["guard"]["recoveries"] == len(recoveries)
    assert recoveries[0]["signal"] == "attention" and recoveries[0]["step"] < 10  # the attention sharpens first
    assert recoveries[0]["rolled_back_to"] < recoveries[0]["step"] and recoveries[0]["lr_scale"] == 0.5
    lrs = {r["step"]: r["lr"] for r in read_records(result.run_dir) if "lr" in r}
    step = recoveries[0]["step"]  # warm-up: lr = 1.5 * step / 100, halved from the first recovery on
    assert lrs[step] == pytest.approx(1.5 * step / 100)
    assert lrs[step + 1] == pytest.approx(1.5 * (step + 1) / 100 * 0.5)


def test_off_is_the_default_and_bit_exact(tmp_path):
    plain = tiny_config(tmp_path / "a")
    plain.pop("guard", None)
    train(resolve(plain)[0])
    train(resolve(tiny_config(tmp_path / "b", guard={"mode": "off"}))[0])
    a, b = final_weights(tmp_path / "a" / "run"), final_weights(tmp_path / "b" / "run")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("guard, named", [({"mode": "on"}, "guard.mode"), ({"factor": 1.0}, "guard.factor"),
                                          ({"lr_backoff": 1.0}, "guard.lr_backoff"), ({"every": 0}, "guard.every")])
def test_bad_guard_settings_name_the_field(tmp_path, guard, named):
    with pytest.raises(ConfigError, match=named):
        resolve(tiny_config(tmp_path, guard=guard))


def test_a_decaying_schedule_is_not_a_jump_but_a_jump_after_the_peak_is():
    """After the lr's peak the update is judged per unit of the peak lr: an update that shrinks
    more slowly than a cosine decay (as Adam's does) never fires; a 10x jump in the decay does."""
    import math

    from foundation.engine.guard_rules import Guard

    def run(jump_at=None):
        guard, fired = Guard(factor=4.0, window=20, warmup=5), []
        for step in range(10, 1001, 10):
            lr = 1e-3 * min(1.0, step / 100) * (0.5 * (1 + math.cos(math.pi * max(0, step - 100) / 900)) + 1e-3)
            update = 0.05 * math.sqrt(lr / 1e-3) * (10 if jump_at and step >= jump_at else 1)
            if guard.check(step, update, lr) is not None:
                fired.append(step)
        return fired

    assert run() == []
    assert run(jump_at=600)[:1] == [600]


def test_a_loss_jump_fires_even_when_the_update_does_not(tmp_path):
    """``guard.loss_factor``: the training loss (the median of the last 3 steps') judged against its
    own recent median, one level per kind of step (the tasks a step trains and their phases: a
    task whose loss is always higher, or a new phase, is no jump); one hard batch is no jump."""
    from foundation.engine.config import GuardConfig
    from foundation.engine.guard import Stability

    model, batch = probe_model(tmp_path)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    cfg = GuardConfig(mode="warn", every=1000, warmup=5, window=10, loss_factor=2.0)  # no update measured here
    guard = Stability(cfg, model, optimizer, scheduler, all_reduce=lambda t, op: t)
    guard.start("seq2seq", batch)
    fired = []
    for step in range(1, 61):
        kind = ("loss/a",) if step % 2 else ("loss/b",)
        loss = 2.0 if step % 2 else 7.0  # b: always 3.5x a, no jump
        if step == 21 or step in (31, 33, 35):
            loss = 4.5  # task a: one hard batch at 21, then a sustained 2.25x
        if step > 50 and kind == ("loss/a",):
            kind, loss = ("loss/a", ("a/phase", 1.0)), 9.0  # a new phase: a new level
        _, action = guard.after_step(step, 1e-3, True, loss, kind)
        if action:
            fired.append((step, action["signal"], action["action"], round(action["ratio"], 2)))
    assert fired == [(33, "loss", "warn", 2.25)]  # once per episode, when the median of 3 has risen
    off = Stability(GuardConfig(mode="warn", loss_factor=0), model, optimizer, scheduler, lambda t, op: t)
    off.start("seq2seq", batch)
    assert all(off.after_step(s, 1e-3, True, 100.0 * s, ())[1] == {} for s in range(1, 30))
    with pytest.raises(ConfigError, match="guard.loss_factor"):
        GuardConfig(loss_factor=0.5)


def test_a_loss_near_zero_that_triples_is_no_jump_but_a_spike_is(tmp_path):
    """The loss rule's floor: near a loss of zero the factor reads noise (0.003 -> 0.010 is 3.3x), so a
    rise must also be LOSS_FLOOR of the first loss; a spike a fifth of the first loss high fires. The
    first loss travels in the guard's state, so a resumed run keeps the floor of its start."""
    from foundation.engine.config import GuardConfig
    from foundation.engine.guard import Stability
    from foundation.engine.guard_rules import LOSS_FLOOR, LossRule

    def losses(blip: float) -> list[float]:
        fall = [2.6 * 0.8 ** i for i in range(30)]  # 2.6 -> 0.003
        return fall + [0.003] * 20 + [blip] * 3 + [0.003] * 5

    def fired(rule: LossRule, series: list[float]) -> list[int]:
        records = [(step, rule.check(step, loss)) for step, loss in enumerate(series, 1)]
        return [step for step, r in records if r is not None and r["new_episode"]]  # one warning an episode

    assert fired(LossRule(3.0, 20, 5), losses(0.010)) == []  # 3.3x, a rise of 0.3 % of the first loss
    assert fired(LossRule(3.0, 20, 5), losses(0.003 + 2 * LOSS_FLOOR * 2.6)) == [52]  # 2 floors high: fires
    assert fired(LossRule(3.0, 20, 5, first=2.6), [0.003] * 20 + [0.010] * 3) == []  # resumed: the start's floor
    assert fired(LossRule(3.0, 20, 5), [0.003] * 20 + [0.010] * 3) == [22]  # without it, 0.003 is the start

    model, batch = probe_model(tmp_path)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    cfg = GuardConfig(mode="warn", every=1000)
    guard = Stability(cfg, model, optimizer, scheduler, all_reduce=lambda t, op: t)
    guard.start("seq2seq", batch)
    for step, loss in enumerate(losses(0.003)[:40], 1):
        guard.after_step(step, 1e-3, True, loss, ("loss/seq2seq",))
    resumed = Stability(cfg, model, optimizer, scheduler, all_reduce=lambda t, op: t)
    resumed.load_state_dict(guard.state_dict())
    resumed.start("seq2seq", batch)
    actions = [resumed.after_step(step, 1e-3, True, loss, ("loss/seq2seq",))[1]
               for step, loss in enumerate([0.003] * 20 + [0.010] * 3, 41)]
    assert not any(actions)


def test_recover_rolls_a_blow_up_in_the_first_steps_back_to_the_start(tmp_path):
    """Before any healthy snapshot (snapshot_every steps) the run's start is the state to go back to."""
    from foundation.engine.config import GuardConfig
    from foundation.engine.guard import Stability

    model, batch = probe_model(tmp_path)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    guard = Stability(GuardConfig(mode="recover", snapshot_every=10), model, optimizer, scheduler, lambda t, op: t)
    guard.start("seq2seq", batch, step=0)
    for step in (1, 2):  # two steps that move every weight, then a non-finite one
        loss, _ = model("seq2seq", batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        guard.after_step(step, 1.0, True, float(loss), ())
    assert not all(torch.equal(v, start[k]) for k, v in model.state_dict().items())
    _, action = guard.after_step(3, 1.0, False)
    assert action["action"] == "recover" and action["rolled_back_to"] == 0 and action["lr_scale"] == 0.5
    assert all(torch.equal(v, start[k]) for k, v in model.state_dict().items())
    assert not optimizer.state and optimizer.param_groups[0]["lr"] == 0.5  # Adam's moments gone with the steps
    warn = Stability(GuardConfig(mode="warn"), model, optimizer, scheduler, lambda t, op: t)
    warn.start("seq2seq", batch)
    assert not warn.snapshots  # only recover keeps copies of the model


def test_a_run_that_loses_what_it_learnt_is_rolled_back_to_its_best(tmp_path):
    """``guard.giveback``: a loss that falls, then climbs back slowly (each step within 1.1x of the
    last, so the jump rules stay quiet) fires once it has lost half its progress, and ``recover``
    goes back to the last snapshot taken at the best loss, not to the recent ones from inside the
    climb; noisy progress and a run that never left its plateau do not fire."""
    import numpy as np

    from foundation.engine.config import GuardConfig
    from foundation.engine.guard import Stability

    model, batch = probe_model(tmp_path)
    tag = next(model.parameters())  # holds the step it was written at, so a rollback shows where it went

    def run(curve, mode="recover"):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
        cfg = GuardConfig(mode=mode, every=1000, snapshot_every=5)
        guard = Stability(cfg, model, optimizer, scheduler, all_reduce=lambda t, op: t)
        guard.start("seq2seq", batch)
        for step, loss in enumerate(curve, 1):
            with torch.no_grad():
                tag.fill_(step)
            _, action = guard.after_step(step, 1e-3, True, float(loss), ())
            if action:
                return step, action, float(tag.flatten()[0]), optimizer.param_groups[0]["lr"]
        return None

    down = np.linspace(3.0, 1.0, 80)
    climb = 1.0 * 1.02 ** np.arange(1, 61)  # 1.02x a step, to 3.3
    step, action, at, lr = run(np.concatenate([down, np.full(20, 1.0), climb]))
    assert action["signal"] == "giveback" and action["action"] == "recover" and 0.5 < action["ratio"] < 0.6
    assert 100 < step < 160 and action["level"] == pytest.approx(1.0, abs=0.01)
    assert 80 <= action["rolled_back_to"] <= 100 and at == action["rolled_back_to"]  # the state at its best
    assert lr == pytest.approx(5e-4)
    rng = np.random.default_rng(0)
    assert run(np.linspace(3.0, 0.5, 300) * rng.uniform(0.8, 1.2, 300)) is None  # noisy progress (+-20 % a step)
    assert run(2.3 * rng.uniform(0.8, 1.2, 300)) is None  # never left its plateau: nothing to lose
    warned = run(np.concatenate([down, np.full(20, 1.0), climb]), mode="warn")
    assert warned[1]["action"] == "warn" and "rolled_back_to" not in warned[1]
    with pytest.raises(ConfigError, match="guard.giveback"):
        GuardConfig(giveback=1.0)


def test_the_attention_watch_sees_each_training_forwards_largest_logit(tmp_path, monkeypatch):
    """``AttentionWatch``: the largest |q.k| / sqrt(head dim) over every attention of a training
    forward (checked against q.k formed by hand); forwards without gradients (the probe, an
    evaluation) are not counted; ``close`` leaves the attentions as they were."""
    import math

    from foundation import layers
    from foundation.engine.guard import AttentionWatch

    model, batch = probe_model(tmp_path)
    seen = []
    original = layers._Heads._attend

    def spy(self, q, k, v, mask, is_causal):
        seen.append(float((q @ k.transpose(-1, -2)).detach().abs().max()) / math.sqrt(q.shape[-1]))
        return original(self, q, k, v, mask, is_causal)

    monkeypatch.setattr(layers._Heads, "_attend", spy)
    watch = AttentionWatch(model)
    assert len(watch.heads) == 6  # encoder 2 self, decoder 2 self + 2 cross
    model("seq2seq", batch)[0].backward()
    assert len(seen) == 6 and watch.take() == pytest.approx(max(seen), rel=1e-5)
    with torch.no_grad():
        model("seq2seq", batch)
    assert math.isnan(watch.take())  # nothing seen: no training forward since the last take
    watch.close()
    assert all(m.logit_watch is None for m in watch.heads)
    model("seq2seq", batch)
    assert not watch.seen


@pytest.mark.parametrize("norm", ["postln", "deepnorm"])
def test_the_attention_watch_skips_what_reads_the_embedding_unnormalised(tmp_path, monkeypatch, norm):
    """Under Post-LN and DeepNorm the first self-attention of each stack reads the embedding with no
    LayerNorm before it, so its logits grow with the embedding's scale: the watch leaves it out
    (encoder and decoder: 2 of the 6 attentions) and takes the largest logit of the other four."""
    import math

    from foundation import layers
    from foundation.engine.guard import AttentionWatch
    from foundation.transformer import Stack

    cfg, specs = resolve(tiny_config(tmp_path, backbone={"norm": norm}))
    model = build_model(cfg, specs, log=lambda s: None)
    task = model.tasks["seq2seq"]
    batch = task.collate([task.train_dataset()[i] for i in range(4)])
    firsts = [s.layers[0].attn for s in model.modules() if isinstance(s, Stack)]
    assert len(firsts) == 2

    def grown(module, args):  # an embedding grown to rms 30, read as it is by these attentions
        x = args[0]
        return (30.0 * x / x.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-12), *args[1:])

    for attn in firsts:
        attn.register_forward_pre_hook(grown)
    seen = {}
    original = layers._Heads._attend

    def spy(self, q, k, v, mask, is_causal):
        seen[id(self)] = float((q @ k.transpose(-1, -2)).detach().abs().max()) / math.sqrt(q.shape[-1])
        return original(self, q, k, v, mask, is_causal)

    monkeypatch.setattr(layers._Heads, "_attend", spy)
    watch = AttentionWatch(model)
    assert len(watch.heads) == 4 and not any(a in watch.heads for a in firsts)
    model("seq2seq", batch)[0].backward()
    others = [v for k, v in seen.items() if k not in {id(a) for a in firsts}]
    assert len(seen) == 6 and min(seen[id(a)] for a in firsts) > 10 * max(others)
    assert watch.take() == pytest.approx(max(others), rel=1e-5)
    watch.close()


def test_the_attention_rule_warns_once_an_episode():
    """``AttentionRule``: growth above the rate over its span fires (the first firing checked by
    hand, at every step and at every second step, as the guard reads); the episode lasts until the
    logit is back at the level it grew from, and a rollback closes it."""
    import math

    from foundation.engine.guard import AttentionRule

    def firings(series, every=1):
        rule = AttentionRule(0.2)
        return [s for s, v in enumerate(series, 1)
                if s % every == 0 and (r := rule.check(s, v)) is not None and r["new_episode"]]

    slow = [5.0 * math.exp(0.1 * s) for s in range(1, 61)]  # 0.1 a step: never
    fast = [5.0 * math.exp(0.1 * s + (0.3 * (s - 10) if s > 10 else 0.0)) for s in range(1, 61)]  # 0.4 from step 10
    assert firings(slow) == firings(slow, every=2) == []
    assert firings(fast) == [12]  # ln(L12 / L8) / 4 = (0.4 + 0.6) / 4 = 0.25; at step 11: 0.175
    assert firings(fast, every=2) == [12]
    rule = AttentionRule(0.2)
    sharp = [5, 5, 5, 5, 5, 12, 20, 30, 30, 30, 30, 30, 8, 6, 5, 5, 5, 5, 5, 12]  # sharpens, stays, comes back
    out = [rule.check(s, v) for s, v in enumerate(sharp, 1)]
    assert [i + 1 for i, r in enumerate(out) if r is not None and r["new_episode"]] == [6, 20]
    assert out[5]["level"] == 5 and out[5]["update"] == 12
    assert rule.firing
    rule.rolled_back()
    assert not rule.firing and rule.check(21, 100.0) is None  # no history after a rollback
    assert rule.check(22, float("nan")) is None and rule.check(23, float("inf")) is None
