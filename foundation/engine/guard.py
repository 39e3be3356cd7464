"""The stability guard: the model update measured while training, and what to do when it jumps.

DeepNet (section 3, figure 4) shows that a run blows up when the *model update*, how far one
optimizer step moves the model's output ||F(x, theta_{t+1}) - F(x, theta_t)||, grows early in
training; DeepNorm and Magneto are built to bound it. ``UpdateMonitor`` measures it during
training, every ``guard.every`` steps:

* ``update/output``: the relative change of the backbone's output (its last block, before the
  final norm, which is what the heads read) on a fixed probe batch, ||F_t - F_prev|| / ||F_prev||;
* ``update/block<i>``: each block's relative weight update ||W_t - W_prev|| / ||W_prev||
  (``update/weights_max``: the largest).

The probe batch is the first ``guard.probe_items`` items of the run's first training batch,
kept as drawn; the probe forward runs in eval mode, without gradients, under a fixed seed with
the RNG states restored after, so measuring changes nothing about the training itself.

``Guard`` judges each measurement against the run's own recent ones: Adam's step is proportional
to the learning rate, so the update per unit of learning rate is steady in a healthy run while
the lr warms up (it falls slowly); after the peak the update is divided by the peak lr, so a
decaying schedule reads as a falling update. The guard fires when that rate exceeds
``guard.factor`` times the median of the last ``guard.window`` measurements (after
``guard.warmup`` of them), or when the training loss (the median of the last 3 steps') exceeds ``guard.loss_factor``
times the median of its last ``guard.window`` healthy steps: the update measure misses some blow-ups
(on the 12-layer seq2seq ladder DeepNorm's, whose update stays level while the loss climbs),
and a rollback needs no lead. A third rule sees a run that learnt and then lost it without any jump
(``guard.giveback``, ``GivebackRule``): the loss climbing back over tens of steps to the plateau
it had left. A fourth looks ahead (``guard.attention``, ``AttentionWatch`` and ``AttentionRule``):
the largest attention logit |q.k| / sqrt(d) of every second training forward growing fast, which leads the
mid-warm-up blow-ups of the seq2seq ladder by ~30 steps where the update and the loss do not move
until the blow-up. ``warn`` says so in one line per
episode; ``recover`` rolls the model and optimizer back to the last state kept in memory
(every ``guard.snapshot_every`` healthy steps), multiplies the learning rate by
``guard.lr_backoff`` for the rest of the run, and goes on. Every firing is written to the
metrics stream (``guard`` events) and to status.json.
"""
from __future__ import annotations

import copy
import math
from collections import deque
from typing import Any, Optional

import torch
from torch import nn

from foundation.engine.data import seeded
from foundation.engine.guard_rules import GivebackRule, Guard, LossRule

ATTENTION_SPAN = 4  # the attention rule judges the largest logit's growth over this many steps
# ... read at every second step: half the cost, and on the ladders' logged series the same warnings
# (the 100-step warm-up ladder, live: 14 of 16 blow-ups 20+ steps ahead, median 27 against 28 at every
# step, and 2 of 16 calm runs fired in); the rule judges a subset of its every-step comparisons
ATTENTION_EVERY = 2
PROBE_SEED = 20_240_917  # the probe forward's RNG (masks a head may draw); restored after
def first_tensor(value: Any) -> Optional[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for v in value:
            if (t := first_tensor(v)) is not None:
                return t
    return None


def probe_items(batch: Any, n: int) -> Any:
    """The first ``n`` items of a collated batch (tensors and lists along their first dimension,
    when it is the batch's), copied so later steps cannot change them."""
    if isinstance(batch, torch.Tensor):
        return batch[:n].clone() if batch.dim() else batch.clone()
    if isinstance(batch, dict):
        return {k: probe_items(v, n) for k, v in batch.items()}
    if isinstance(batch, list):
        return [probe_items(v, n) if isinstance(v, (torch.Tensor, dict)) else v for v in batch[:n]]
    if isinstance(batch, tuple):
        return tuple(probe_items(v, n) for v in batch)
    return copy.deepcopy(batch)


class _Captured(Exception):
    """Raised by the probe's hook once the end blocks' outputs are all in: the rest of the forward is skipped."""


class UpdateMonitor:
    """``measure() -> {"update/output": ..., "update/block<i>": ..., "update/weights_max": ...}``:
    how far the model moved since the previous call (the first call sets the reference)."""

    def __init__(self, model: nn.Module, task_id: str, probe: Any):
        self.model, self.task_id, self.probe = model, task_id, probe
        self.blocks = [b for name, m in model.backbone.named_modules()
                       if name.endswith("layers") and isinstance(m, nn.ModuleList) for b in m]
        ends = [m[len(m) - 1] for name, m in model.backbone.named_modules()
                if name.endswith("layers") and isinstance(m, nn.ModuleList) and len(m)]
        self.ends = ends or [model.backbone]
        self.prev_out: Optional[torch.Tensor] = None
        # the blocks' weights are kept as one flat vector: a handful of ops a measurement, not four a tensor
        self.params = [p for b in self.blocks for p in b.parameters()]
        self.block_sizes = [sum(p.numel() for p in b.parameters()) for b in self.blocks]
        self.prev_weights: Optional[torch.Tensor] = None
        self.prev_norms: Optional[torch.Tensor] = None
        self.modules = list(model.modules())
        # how many times a whole probe forward calls the end blocks (counted on the first): later forwards stop
        # at the last call, so the heads, and their losses (a transducer's joint lattice), are not computed
        self.calls: Optional[int] = None

    def output(self) -> torch.Tensor:
        outs: list[torch.Tensor] = []
        stop_at = self.calls

        def keep(module, args, out) -> None:
            t = first_tensor(out)
            if t is not None:
                outs.append(t.detach().float().flatten())
            if stop_at is not None and len(outs) == stop_at:
                raise _Captured

        hooks = [m.register_forward_hook(keep) for m in self.ends]
        # eval mode for the probe, then every module's own flag back: what model.eval() and
        # model.train(mode) do to the flags (a module that keeps itself in eval keeps its False),
        # without nn.Module.__setattr__'s checks, which cost a tiny model's probe a fifth of its time
        flags = [m.training for m in self.modules]
        for m in self.modules:
            m.__dict__["training"] = False
        try:
            with torch.no_grad(), seeded(PROBE_SEED):
                self.model(self.task_id, self.probe)
        except _Captured:
            pass
        finally:
            for h in hooks:
                h.remove()
            for m, flag in zip(self.modules, flags):
                m.__dict__["training"] = flag
        if self.calls is None:
            self.calls = len(outs)
        return torch.cat(outs)

    def block_updates(self) -> list[float]:
        """Each block's ||W_t - W_prev|| / ||W_prev|| (empty on the first call), and the weights
        kept for the next: all blocks' weights in one flat copy, split per block."""
        if not self.params:
            return []
        now = torch.cat([p.detach().float().flatten() for p in self.params])  # a copy, kept past the next step
        now_norms = torch.stack([w.norm() for w in now.split(self.block_sizes)])
        updates: list[float] = []
        if self.prev_weights is not None:
            moved = torch.stack([d.norm() for d in (now - self.prev_weights).split(self.block_sizes)])
            updates = (moved / self.prev_norms.clamp_min(1e-12)).tolist()
        self.prev_weights, self.prev_norms = now, now_norms
        return updates

    def measure(self) -> dict[str, float]:
        out = self.output()
        blocks = self.block_updates()
        record: dict[str, float] = {}
        if self.prev_out is not None and self.prev_out.shape == out.shape:
            record["update/output"] = float((out - self.prev_out).norm() / self.prev_out.norm().clamp_min(1e-12))
            record.update({f"update/block{i}": v for i, v in enumerate(blocks)})
            if blocks:
                record["update/weights_max"] = max(blocks)
        self.prev_out = out
        return record

    def reset(self) -> None:
        """After a rollback: the next measurement only sets the reference."""
        self.prev_out, self.prev_weights = None, None


class AttentionWatch:
    """The largest attention logit |q.k| / sqrt(head dim) of each training forward, over every
    attention of the model (self- and cross-, before any relative-position bias or mask) and every
    item of the batch: what grows without bound in the high-learning-rate instability qk-layernorm
    removes (Wortsman et al. 2023). ``take()`` -> that step's value (nan when no training forward
    ran) and starts the next.

    Each ``_Heads`` hands its (q, k) over before the fused kernel, which never forms q.k; forwards
    without gradients (the probe, evaluations) are not training forwards and are skipped. The whole
    batch, not a few items: on the 8 first items of each batch the largest logit is noisier and the
    rule fired in 5 of the warm-up ladder's 16 runs that do not blow up, against 2 on the whole
    batch. Each attention's largest |q.k| stays on the device and is scaled and reduced once a
    step, in ``take`` (one host sync). It reads only while ``active`` (the guard sets it for every
    ``ATTENTION_EVERY``-th step).

    Only attentions reading a LayerNorm's output (Wortsman et al.'s setting), not a Post-LN or
    DeepNorm stack's first (``post_norm_inputs``): its logits follow the raw embedding's scale,
    which grows at any lr (24-layer ASR, lowest lr: 4.5 -> 180 in 40 steps; other layers 1-5)."""

    def __init__(self, model: nn.Module):
        from foundation.layers import _Heads
        from foundation.transformer import post_norm_inputs

        skipped = post_norm_inputs(model)
        self.heads = [m for m in model.modules() if isinstance(m, _Heads) and id(m) not in skipped]
        self.active = True
        self.seen: list[torch.Tensor] = []  # this step's, each already divided by sqrt(head dim) unless shared
        dims = {m.head_dim for m in self.heads}
        self.shared_scale = dims.pop() ** -0.5 if len(dims) == 1 else None
        for m in self.heads:
            m.logit_watch = self.see

    def see(self, q: torch.Tensor, k: torch.Tensor) -> None:
        if not self.active or not torch.is_grad_enabled():
            return
        with torch.no_grad():
            largest = (q @ k.transpose(-1, -2)).abs_().amax()
            self.seen.append(largest if self.shared_scale is not None else largest * q.shape[-1] ** -0.5)

    def take(self, all_reduce=None) -> float:
        if not self.seen:
            return float("nan")
        value = torch.stack(self.seen).max().float() * (self.shared_scale or 1.0)
        self.seen = []
        if all_reduce is not None:
            value = all_reduce(value.reshape(1), "max")[0]
        return float(value)

    def close(self) -> None:
        for m in self.heads:
            m.__dict__.pop("logit_watch", None)


class AttentionRule:
    """Fires when the largest attention logit grew faster than ``rate`` per step, on a log scale,
    over the last ``span`` steps (the guard's: ``ATTENTION_SPAN``): ln(L_t / L_{t-span}) / span > rate. Calibrated on the
    12-layer seq2seq ladders (benchmarks/attention_logits.py, docs/studies.md): at 0.2 it warns 20
    or more steps before 14 of the 16 mid-run blow-ups of the 100-step warm-up ladder (median lead
    27) and fires in none of the tiny recipes at their own learning rates; it also
    fires in runs whose lr is too high to learn, where the attention sharpens and the loss stays on
    its plateau. An episode lasts until the logit is back at the level it grew from: a run whose
    attention went on sharpening, or stayed sharp and then blew up, is one warning.
    ``check(step, logit)`` -> None or the firing's record (``update``: the logit, ``level``: span steps ago)."""

    def __init__(self, rate: float, span: int = ATTENTION_SPAN):
        self.rate, self.span = rate, span
        self.recent: dict[int, float] = {}
        self.firing = False
        self.base = 0.0  # inside an episode: the logit it grew from

    def check(self, step: int, logit: float) -> Optional[dict[str, float]]:
        if not math.isfinite(logit):
            return None  # a non-finite step is the other rules' (and the engine's) to judge
        self.recent[step] = logit
        then = self.recent.get(step - self.span)
        for old in [s for s in self.recent if s <= step - self.span]:
            del self.recent[old]  # what the next steps will not look back to
        if then is None or then <= 0 or logit <= 0:
            return None
        growth = math.log(logit / then) / self.span
        if growth > self.rate:
            new = not self.firing
            if new:
                self.firing, self.base = True, then
            # "rate": what is judged against "level", as the other rules' records (the logit, span steps apart)
            return {"step": step, "update": logit, "rate": logit, "level": then, "growth": growth, "new_episode": new}
        if self.firing and logit <= self.base:
            self.firing = False
        return None

    def rolled_back(self) -> None:
        """The logits it holds are gone with the steps rolled back; no episode is open."""
        self.firing = False
        self.recent.clear()


class Snapshot:
    """The last good model and optimizer state, kept in memory for ``recover``."""

    def __init__(self) -> None:
        self.step: Optional[int] = None
        self.model: dict[str, torch.Tensor] = {}
        self.optimizer: dict[str, Any] = {}
        self.ema: Optional[dict[str, torch.Tensor]] = None

    def take(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, ema=None) -> None:
        self.step = step
        self.model = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.optimizer = copy.deepcopy(optimizer.state_dict())
        # the weights' EMA (train.ema) is training state too: left alone it would keep the steps rolled back
        self.ema = {k: v.clone() for k, v in ema.state_dict().items()} if ema is not None else None

    def restore(self, model: nn.Module, optimizer: torch.optim.Optimizer, ema=None) -> None:
        model.load_state_dict(self.model)
        if ema is not None and self.ema is not None:
            ema.load_state_dict(self.ema)
        # the learning rates stay the current ones (the caller lowers them): only the moments go back
        lrs = [g["lr"] for g in optimizer.param_groups]
        optimizer.load_state_dict(copy.deepcopy(self.optimizer))
        for g, lr in zip(optimizer.param_groups, lrs):
            g["lr"] = lr


class Stability:
    """What the trainer calls: ``start(model, task_id, batch)`` before the first step's forward,
    ``after_step(step, lr, finite)`` after each optimizer step -> (metrics, action). An action
    (a dict, empty when none) is a warning or a recovery, for the metrics stream and status.json."""

    def __init__(self, cfg, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler, all_reduce, ema=None):
        self.cfg, self.model, self.optimizer, self.scheduler, self.ema = cfg, model, optimizer, scheduler, ema
        self.all_reduce = all_reduce
        self.monitor: Optional[UpdateMonitor] = None
        self.guard = Guard(cfg.factor, cfg.window, cfg.warmup)
        # one loss level per set of tasks a step trains and their phases (train.mix: sample draws tasks
        # whose losses differ; the ASR head adds its transducer loss at rnnt_start)
        self.loss_rules: dict[tuple, LossRule] = {}
        self.loss_first: dict[str, float] = {}  # each kind's first loss, from a resumed run's checkpoint
        self.giveback_rules: dict[tuple, GivebackRule] = {}
        self.attention = AttentionWatch(model) if cfg.attention else None
        self.attention_rules: dict[tuple, AttentionRule] = {}
        # recover: the last snapshot taken while a kind of step's loss was at its best, what a giveback
        # rolls back to (the regular snapshots are from inside the slow climb by the time it fires)
        self.best_snapshot: Optional[tuple[tuple, Snapshot]] = None
        self.snapshots: deque[Snapshot] = deque(maxlen=2)  # the older one is rolled back to
        self.recoveries = 0
        self.actions: list[dict] = []

    @property
    def started(self) -> bool:
        return self.monitor is not None

    def start(self, task_id: str, batch: Any, step: int = 0) -> None:
        """Before the first step (of this process: ``step`` steps are done): the probe, and for
        ``recover`` the first snapshot, so that a run blowing up in its first steps, before any
        healthy snapshot, is rolled back to its start rather than only warned about."""
        self.monitor = UpdateMonitor(self.model, task_id, probe_items(batch, self.cfg.probe_items))
        self.monitor.measure()  # the reference: the model before its first step
        self._watch_attention(step + 1)
        if self.cfg.mode == "recover":
            snap = Snapshot()
            snap.take(step, self.model, self.optimizer, self.ema)
            self.snapshots.append(snap)

    @property
    def loss_guard_firing(self) -> bool:
        return any(r.firing for r in self.loss_rules.values())

    @property
    def firing(self) -> bool:
        """Inside an episode of the rules that see a run going wrong (not the attention rule's, which
        warns ahead and may stay open for the rest of a run: it holds back no later warning)."""
        return self.guard.firing or self.loss_guard_firing or any(r.firing for r in self.giveback_rules.values())

    def after_step(self, step: int, lr: float, finite: bool, loss: float = float("nan"),
                   kind: tuple = ()) -> tuple[dict[str, float], dict]:
        """``loss``: the step's training loss, the same on every rank (the trainer all-reduces it);
        ``kind``: what makes that loss comparable to another step's (the tasks trained, their phases)."""
        if self.monitor is None:
            return {}, {}
        record: dict[str, float] = {}
        fired = None
        logit = self.attention.take(self.all_reduce) if self.attention is not None else float("nan")
        self._watch_attention(step + 1)
        if not finite:  # a skipped step: the model did not move, the optimizer state may have
            fired = {"step": step, "update": float("nan"), "rate": float("nan"), "level": float("nan"),
                     "new_episode": not self.firing, "nonfinite": True,
                     "signal": "update"} if self.cfg.mode == "recover" else None
        else:
            if step % self.cfg.every == 0:
                record = self.monitor.measure()
                if "update/output" in record:
                    device = next(self.model.parameters()).device  # every rank decides alike
                    update = float(self.all_reduce(torch.tensor([record["update/output"]], device=device), "mean")[0])
                    fired = self.guard.check(step, update, lr)
                    if fired is not None:
                        fired.update(signal="update", new_episode=fired["new_episode"] and not self.loss_guard_firing)
            if self.cfg.loss_factor and loss == loss:
                rule = self.loss_rules.get(kind) or self.loss_rules.setdefault(
                    kind, LossRule(self.cfg.loss_factor, self.cfg.window, self.cfg.warmup,
                                   self.loss_first.get(repr(kind))))  # built once per kind
                by_loss = rule.check(step, loss)
                if by_loss is not None and fired is None:
                    fired = {**by_loss, "signal": "loss", "new_episode": by_loss["new_episode"] and not self.guard.firing}
            if logit == logit:
                record["attention/logit_max"] = logit
                others = self.firing
                rule = self.attention_rules.get(kind) or self.attention_rules.setdefault(
                    kind, AttentionRule(self.cfg.attention))
                by_attention = rule.check(step, logit)
                if by_attention is not None and fired is None:
                    fired = {**by_attention, "signal": "attention", "new_episode": by_attention["new_episode"] and not others}
            if self.cfg.giveback and loss == loss:
                others = self.firing
                rule = self.giveback_rules.get(kind) or self.giveback_rules.setdefault(kind, GivebackRule(self.cfg.giveback))
                by_giveback = rule.check(step, loss)
                if by_giveback is not None and fired is None:
                    fired = {**by_giveback, "signal": "giveback", "kind": kind,
                             "new_episode": by_giveback["new_episode"] and not others}
        action = self._act(step, fired) if fired is not None else {}
        healthy = fired is None and finite and not self.firing
        if healthy and self.cfg.mode == "recover" and step % self.cfg.snapshot_every == 0:
            reuse = len(self.snapshots) == self.snapshots.maxlen and (
                self.best_snapshot is None or self.snapshots[0] is not self.best_snapshot[1])
            snap = self.snapshots[0] if reuse else Snapshot()
            snap.take(step, self.model, self.optimizer, self.ema)
            self.snapshots.append(snap)
            rule = self.giveback_rules.get(kind)
            if rule is not None and rule.at_best:
                self.best_snapshot = (kind, snap)
        if action:
            self.actions.append(action)
        return record, action

    def _act(self, step: int, fired: dict) -> dict:
        # "update": the signal's value (the model update, the loss, or the largest attention logit)
        # ratio: how far above its level the signal is (for the attention, the logit ATTENTION_SPAN
        # steps before); for a giveback, the share of the progress lost
        ratio = fired["rate"] if fired["signal"] == "giveback" else (
            fired["rate"] / fired["level"] if fired["level"] else float("nan"))
        action = {"step": step, "signal": fired["signal"], "update": fired["update"], "level": fired["level"],
                  "ratio": ratio}
        if self.cfg.mode == "warn":
            return {**action, "action": "warn"} if fired["new_episode"] else {}
        if not self.snapshots or self.recoveries >= self.cfg.max_recoveries:
            return {**action, "action": "warn", "why": "no snapshot yet" if not self.snapshots
                    else f"guard.max_recoveries={self.cfg.max_recoveries} reached"} if fired["new_episode"] else {}
        snap = self.snapshots[0]
        if fired["signal"] == "giveback" and self.best_snapshot is not None and self.best_snapshot[0] == fired["kind"]:
            snap = self.best_snapshot[1]
        snap.restore(self.model, self.optimizer, self.ema)
        sched = self.scheduler
        for i, group in enumerate(self.optimizer.param_groups):
            sched.base_lrs[i] *= self.cfg.lr_backoff
            group["lr"] = sched.base_lrs[i] * sched.lr_lambdas[i](sched.last_epoch)
        sched._last_lr = [g["lr"] for g in self.optimizer.param_groups]
        self.recoveries += 1
        self.snapshots.clear()
        self.snapshots.append(snap)  # rolling back twice goes to the same good state
        self.monitor.reset()
        self.monitor.measure()
        self.guard.firing = False
        for rule in [*self.loss_rules.values(), *self.giveback_rules.values(), *self.attention_rules.values()]:
            rule.rolled_back()
        return {**action, "action": "recover", "rolled_back_to": snap.step,
                "lr_scale": self.cfg.lr_backoff ** self.recoveries, "recoveries": self.recoveries}

    def _watch_attention(self, step: int) -> None:
        """Whether the attention rule reads the logits of ``step``'s forward."""
        if self.attention is not None:
            self.attention.active = step % ATTENTION_EVERY == 0

    def close(self) -> None:
        """The model's attentions back as they were (the run is over)."""
        if self.attention is not None:
            self.attention.close()

    def state_dict(self) -> dict:
        # each loss rule's first loss (its floor): a run resumed near a loss of zero keeps the floor of its start
        first = {**self.loss_first, **{repr(k): r.first for k, r in self.loss_rules.items() if r.first is not None}}
        return {"recoveries": self.recoveries, "actions": self.actions, "loss_first": first}

    def load_state_dict(self, state: dict) -> None:
        self.recoveries, self.actions = int(state["recoveries"]), list(state["actions"])
        self.loss_first = dict(state.get("loss_first", {}))


def describe(action: dict[str, Any], step: int, max_recoveries: int) -> str:
    """The one line a warning (once an episode) or a recovery prints."""
    signal = action["signal"]
    if signal == "giveback":
        jumped = (f"the training loss climbed back to {action['update']:.4g} from its best {action['level']:.4g}, "
                  f"losing {action['ratio']:.0%} of its progress")
    elif signal == "attention":
        jumped = (f"the largest attention logit grew {action['ratio']:.1f}x in {ATTENTION_SPAN} steps, "
                  f"from {action['level']:.3g} to {action['update']:.3g}")
    else:
        what = "the training loss" if signal == "loss" else "the model update"
        jumped = f"{what} jumped to {action['ratio']:.1f}x its recent level"
    if action["action"] == "recover":
        return (f"guard: step {step}: {jumped}; rolled back to step {action['rolled_back_to']}, learning rate "
                f"x{action['lr_scale']:g} from now "
                f"(recovery {action['recoveries']} of guard.max_recoveries={max_recoveries})")
    value = "" if signal in ("giveback", "attention") else (
        f" ({action['update']:.4g})" if signal == "loss" else f" ({action['update']:.3g} a step)")
    may = {"giveback": "losing what it learnt", "attention": "sharpening its attention as runs about to blow up do"}
    return (f"guard: step {step}: {jumped}{value}; the run may be {may.get(signal, 'diverging')}"
            + (f" ({action['why']})" if "why" in action else " (guard.mode=recover rolls back)"))
