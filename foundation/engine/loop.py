"""The training loop every task uses: a plain PyTorch recipe read top to bottom.

``train(cfg)`` builds the tasks, the shared backbone and the heads, the optimizer and
schedule, wraps the model for the processes torchrun started, and runs::

    for each step:
        for each micro-batch (grad_accum) and each task the step draws (train.mix):
            loss = weight * head(backbone, batch) / grad_accum; backward
        all-reduce the losses; clip; if loss or grad norm is not finite: skip, count
        else: optimizer step, EMA update; scheduler step; log
        every eval.every: evaluate every task, keep best/; every save.every: checkpoint

A run of ``train.max_nonfinite`` non-finite steps ends the run with status "diverged"
and a message naming the step, the task and the last good checkpoint; divergence is a
result (the depth comparisons record it), not a crash.

Every run that returns (finished, stopped, diverged, interrupted) leaves ``status.json``
in its run directory: ``{"status", "step", "steps", "message", "metrics", ...}``, the
machine-readable outcome that ``foundation compare`` reads; a run that fails leaves
``"status": "failed"`` with the one-line reason (``failure.py``) and the traceback in
``error.log``. A run that is still going, or was killed, has none (a stale one is removed
when the run starts).

The run directory belongs to one process at a time (``rundir.RunDir``, a lock). A
resume reads before it writes: the config is compared with the run's (``rundir``), the
weights and training state are loaded, and only then are config.yaml and the logs
touched, so a refused resume changes nothing. Weights that are not finite are never
written, as best/ or as a checkpoint: the run ends "diverged" instead. Nor is a model whose
training loss is blown up (above ``train.explode_factor`` x the first, ``blowup.LossWatch``):
mid-run it is evaluated but not saved, at the end the run ends "diverged".
"""
from __future__ import annotations

import contextlib
import json
import math
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from foundation import checkpoint
from foundation.checkpoint import CheckpointError
from foundation.config import ConfigError
from foundation.engine import distributed
from foundation.engine.run_state import MODEL_FILE, Checkpointer, rng_state, set_rng_state, write_text_atomic
from foundation.engine.config import TaskSpec, TrainConfig, best_metric, resolve
from foundation.engine.data import TaskStream, step_plan, to_device
from foundation.engine.distributed import Env
from foundation.engine.evaluation import autocast, evaluate, next_batch
from foundation.engine.failure import one_line
from foundation.engine.blowup import LossWatch
from foundation.engine.guard import Stability, describe
from foundation.engine.metrics_log import MetricsLog, Progress
from foundation.engine.init import check_init_from, load_init_from
from foundation.engine.model import ModelConfig, MultiTaskModel
from foundation.engine.optim import EMA, build_optimizer, build_scheduler, grad_total_norm
from foundation.engine.rundir import STATUS_FILE, RunDir, describe_changes, resume_changes, write_config

STATE_VERSION = 1


@dataclass
class RunResult:
    status: str  # finished | stopped (train.stop_at) | diverged | interrupted (Ctrl-C)
    step: int
    run_dir: Path
    metrics: dict[str, float] = field(default_factory=dict)  # the last evaluation
    message: str = ""
    last_checkpoint: Path | None = None
    nonfinite_total: int = 0
    best_key: str = ""
    best_value: float | None = None
    best_step: int | None = None


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_model(cfg: TrainConfig, specs: list[TaskSpec], log=print) -> MultiTaskModel:
    """Backbone + heads; ``init_from`` loads the backbone and the matching head tensors,
    reporting what was resized or skipped (``foundation.engine.init``)."""
    model = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs))
    model.init_report = load_init_from(model, cfg.init_from, cfg.init_expert, log) if cfg.init_from else None
    return model


def nonfinite_tensors(model: torch.nn.Module, env: Env) -> list[str]:
    """Names of the floating-point tensors of ``model`` holding NaN or inf (this rank's
    shards under FSDP); every rank learns whether any rank found one."""
    bad = []
    for name, t in model.state_dict().items():
        t = t.to_local() if hasattr(t, "to_local") else t
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad.append(name)
    count = distributed.all_reduce(torch.tensor([len(bad)], device=env.device))
    return bad or (["(on another rank)"] if int(count.item()) else [])


class Trainer:
    """One run: ``Trainer(cfg, specs, env, run_dir).run() -> RunResult``; ``run_dir`` is
    the locked ``RunDir`` (``train()`` takes it)."""

    def __init__(self, cfg: TrainConfig, specs: list[TaskSpec], env: Env, run_dir: RunDir):
        self.cfg, self.specs, self.env = cfg, specs, env
        self.run_dir, self.dir = cfg.run_dir, run_dir
        self.ckpt = Checkpointer(self.run_dir, cfg.save.keep, env)
        resume_from = self._prepare_run_dir()
        self.changes = resume_changes(self.run_dir, cfg) if resume_from is not None else []

        seed_all(cfg.seed)  # the same initial weights on every rank
        self.model = build_model(cfg, specs, log=self.say)
        if resume_from is not None:
            checkpoint.load_state_into(self.model, resume_from / MODEL_FILE)
        self.model.to(env.device)
        self.wrapped = distributed.wrap(self.model, env, cfg.train.strategy, find_unused=len(specs) > 1)
        if cfg.train.compile:
            self.wrapped = torch.compile(self.wrapped)
        report = self.model.init_report  # what optim.freeze_pretrained_steps holds
        pretrained = set(report.loaded) if report is not None else set()
        self.optimizer = build_optimizer(self.model, cfg.optim, pretrained=pretrained)
        self.scheduler = build_scheduler(self.optimizer, cfg.schedule, cfg.optim.lr, cfg.train.steps)
        self.scaler = torch.amp.GradScaler("cuda") if cfg.train.precision == "fp16" else None
        if cfg.train.ema is not None and cfg.train.strategy == "fsdp" and env.distributed:
            raise ConfigError("field 'train.ema': EMA is not supported with train.strategy=fsdp")
        self.ema = EMA(self.model, cfg.train.ema) if cfg.train.ema is not None else None
        if cfg.guard.mode != "off" and cfg.train.strategy == "fsdp" and env.distributed:
            raise ConfigError("field 'guard.mode': the stability guard is not supported with train.strategy=fsdp")
        self.losses = LossWatch(cfg.train.explode_factor, cfg.train.steps)
        self.stability = (Stability(cfg.guard, self.model, self.optimizer, self.scheduler, distributed.all_reduce,
                                    self.ema) if cfg.guard.mode != "off" else None)
        self.streams = {
            s.id: TaskStream(self.model.tasks[s.id].train_dataset(), self.model.tasks[s.id].collate,
                             batch_size=s.batch_size or cfg.train.batch_size, rank=env.rank, world=env.world,
                             seed=cfg.seed * 1000 + i, num_workers=cfg.train.num_workers, name=s.id,
                             pin_memory=env.device.type == "cuda")
            for i, s in enumerate(specs)
        }
        self.step = 0
        self.samples = 0
        self.nonfinite_in_a_row = self.nonfinite_total = 0
        self.best_key, self.best_higher = self._best_metric()
        self.best_value: float | None = None
        self.best_step: int | None = None
        self.metrics: dict[str, float] = {}
        self.eval_sets: dict[str, Any] = {}
        seed_all(cfg.seed + 7919 * (env.rank + 1))  # dropout etc. differ between ranks
        if resume_from is not None:
            self._load_state(resume_from)
            self.say(f"resumed from {resume_from} at step {self.step}"
                     + (f" with {describe_changes(self.changes)} (--allow-change)" if self.changes else ""))
            self._commit(self.changes, resumed=True)  # everything loaded: only now is the run directory written
        self.resumed_at = self.step if resume_from is not None else None

    # ------------------------------------------------------------------ setup

    def say(self, message: str) -> None:
        if self.env.is_main:
            print(message, flush=True)

    def _prepare_run_dir(self) -> Path | None:
        """Refuse to overwrite a run by accident; returns the checkpoint to resume from.
        A new run's directory is written now; a resumed one only once its state has loaded."""
        cfg, latest = self.cfg, self.ckpt.latest()
        if cfg.resume:
            if latest is not None:
                return latest
            self.say(f"resume=true: no checkpoint in {self.run_dir}/ckpt yet, starting from scratch")
            if self.env.is_main:  # logs of an attempt that never reached a checkpoint
                for stale in ("metrics.jsonl", "tb", "best"):
                    path = self.run_dir / stale
                    shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        elif latest is not None or (self.run_dir / "metrics.jsonl").exists():
            if not cfg.overwrite:
                raise ConfigError(
                    f"{self.run_dir} already holds a run; resume=true continues it, overwrite=true "
                    "replaces it, run_name=... starts another"
                )
            distributed.barrier()
            if self.env.is_main:
                self.dir.clear()
        self._commit()
        return None

    def _commit(self, changes=(), resumed: bool = False) -> None:
        """Make the run directory this invocation's: config.yaml (with the accepted changes
        in its history), and the debris of an interrupted save removed."""
        distributed.barrier()
        if self.env.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_config(self.run_dir, self.cfg, changes, getattr(self, "step", 0), resumed)
            self.ckpt.clean()
        self.dir.committed = True
        distributed.barrier()

    def _best_metric(self) -> tuple[str, bool]:
        return best_metric(self.cfg, self.specs)

    # ------------------------------------------------------------------ state

    def _state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "step": self.step,
            "samples": self.samples,
            "world": self.env.world,
            "optimizer": self._optimizer_state(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "streams": {k: s.state_dict() for k, s in self.streams.items()},
            "nonfinite": {"in_a_row": self.nonfinite_in_a_row, "total": self.nonfinite_total},
            "losses": self.losses.state_dict(),
            "guard": self.stability.state_dict() if self.stability is not None else None,
            "best": {"key": self.best_key, "value": self.best_value, "step": self.best_step},
            "rng": rng_state(),
        }

    def _load_state(self, path: Path) -> None:
        state = self.ckpt.load_state(path)
        self.step, self.samples = int(state["step"]), int(state["samples"])
        # this config's hyperparameters, which loading the saved state replaces
        fresh = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        try:
            if distributed.is_fsdp(self.model):  # keyed by parameter name, whole tensors
                from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

                set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"],
                                         options=StateDictOptions(full_state_dict=True))
            else:
                self.optimizer.load_state_dict(state["optimizer"])
        except (ValueError, KeyError, RuntimeError) as e:
            raise CheckpointError(f"{path / 'state.pt'}: the optimizer state does not fit this model and config "
                                  f"({one_line(e)})") from None
        self.scheduler.load_state_dict(state["scheduler"])
        if any(k.startswith(("optim.", "schedule.", "train.steps")) for k, _, _ in self.changes):
            self._use_new_hyperparameters(fresh)
        if self.scaler is not None and state["scaler"] is not None:
            self.scaler.load_state_dict(state["scaler"])
        if self.ema is not None and state["ema"] is not None:
            self.ema.load_state_dict(state["ema"])
        for k, s in self.streams.items():
            if k in state["streams"]:
                s.load_state_dict(state["streams"][k])
        self.nonfinite_in_a_row = int(state["nonfinite"]["in_a_row"])
        self.nonfinite_total = int(state["nonfinite"]["total"])
        if state.get("losses") is not None:  # (checkpoints from before the divergence rule have none)
            self.losses.load_state_dict(state["losses"])
        if self.stability is not None and state.get("guard") is not None:
            self.stability.load_state_dict(state["guard"])
        if state["best"]["key"] == self.best_key:
            self.best_value, self.best_step = state["best"]["value"], state["best"]["step"]
        if state["rng"] is not None and state["world"] == self.env.world:
            set_rng_state(state["rng"])

    def _use_new_hyperparameters(self, fresh: list[dict]) -> None:
        """After an allowed change of optim.* / schedule.* / train.steps on resume: each
        group's lr, weight decay, betas and eps from this config (the saved optimizer state
        brought the old ones), the schedule's base lrs with them, and the lr of the next
        step set from the (new) schedule at the resumed step."""
        sched = self.scheduler
        for i, (group, new) in enumerate(zip(self.optimizer.param_groups, fresh)):
            for key in ("weight_decay", "betas", "eps", "initial_lr"):
                if key in new:
                    group[key] = new[key]
            sched.base_lrs[i] = new["initial_lr"]
            group["lr"] = new["initial_lr"] * sched.lr_lambdas[i](sched.last_epoch)
        sched._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def _model_writer(self) -> Callable[[Path], None]:
        """``write(path)`` of the weights for rank 0. Under FSDP the whole state dict is
        gathered first, a collective: every rank calls this."""
        if not distributed.is_fsdp(self.model):
            return lambda path: checkpoint.save(self.model, path)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

        def write(path: Path) -> None:
            with torch.random.fork_rng(devices=[]):  # building initialises: keep the RNG untouched
                plain = MultiTaskModel(self.model.config)
            plain.load_state_dict(full, assign=True)
            checkpoint.save(plain, path)

        return write

    def _optimizer_state(self) -> dict[str, Any]:
        if distributed.is_fsdp(self.model):  # gathered whole onto rank 0 (a collective)
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            return get_optimizer_state_dict(self.model, self.optimizer,
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return self.optimizer.state_dict()

    def save(self) -> Path:
        state = self._state() if self.env.is_main or distributed.is_fsdp(self.model) else {}
        return self.ckpt.save(self.step, self._model_writer(), state)

    # ------------------------------------------------------------------ one step

    def train_step(self) -> dict[str, Any]:
        cfg, env = self.cfg, self.env
        plan = step_plan(cfg.train.mix, [s.id for s in self.specs], [s.weight for s in self.specs],
                         self.step, cfg.seed)
        accum = cfg.train.grad_accum
        ids = [tid for tid, _ in plan]
        losses = torch.zeros(len(plan), device=env.device, dtype=torch.float64)
        logs: dict[str, float] = {}
        samples, backward, total = 0, 0, accum * len(plan)
        start = time.perf_counter()
        for _ in range(accum):
            for i, (tid, weight) in enumerate(plan):
                batch = to_device(next_batch(self.streams[tid], tid, "train"), env.device)
                if self.stability is not None and not self.stability.started:  # the probe: the model before step 1
                    self.stability.start(tid, batch, self.step)
                backward += 1
                with distributed.grad_sync(self.wrapped, backward == total):  # forward and backward
                    with autocast(cfg, env.device):
                        loss, extra = self.wrapped(tid, batch)
                    scaled = loss.float() * (weight / accum)
                    (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
                losses[i] += loss.detach().double() / accum
                for k, v in extra.items():  # kept on the device: one host sync a step, below
                    v = v.detach().double() if torch.is_tensor(v) else float(v)
                    logs[f"{tid}/{k}"] = logs.get(f"{tid}/{k}", 0.0) + v / accum
                samples += self.streams[tid].batch_size * env.world
        # every rank takes the same decision: the losses are all-reduced, the grads already are
        distributed.all_reduce(losses, "mean")
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grad_norm = grad_total_norm(self.model.parameters(), cfg.optim.clip_grad)
        if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
            grad_norm = grad_norm.full_tensor()
        # every number this step logs, to the host at once
        pending = [k for k, v in logs.items() if torch.is_tensor(v)]
        values = torch.cat([losses, grad_norm.detach().double().view(1).to(losses.device)]
                           + [logs[k].view(1).to(losses.device) for k in pending]).tolist()
        loss_values, grad_norm = values[:len(plan)], values[len(plan)]
        logs.update(zip(pending, values[len(plan) + 1:]))
        bad = [tid for tid, v in zip(ids, loss_values) if not math.isfinite(v)]
        finite = not bad and (math.isfinite(grad_norm) or self.scaler is not None)
        if finite:
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            if self.ema is not None:
                self.ema.update(self.model)
        self.optimizer.zero_grad(set_to_none=True)
        lr = self.optimizer.param_groups[-1]["lr"]  # the top group: the head, scale 1
        self.scheduler.step()
        self.step += 1
        self.samples += samples
        elapsed = time.perf_counter() - start
        weights = dict(plan)
        record = {
            "loss": sum(weights[t] * v for t, v in zip(ids, loss_values)),
            **{f"loss/{t}": v for t, v in zip(ids, loss_values)},
            "lr": lr, "grad_norm": grad_norm, "samples_per_s": samples / max(elapsed, 1e-9),
            "step_time": elapsed, **logs,
        }
        if env.device.type == "cuda":  # peak so far, for sizing batches (benchmarks/paper_sizes.py)
            record["mem_gib"] = torch.cuda.max_memory_allocated(env.device) / 2**30
        if not finite:
            record.update(skipped=True, bad_task=bad[0] if bad else ",".join(ids),
                          bad_what="loss" if bad else "gradients")
        return record

    # ------------------------------------------------------------------ the run

    def evaluate(self, log: MetricsLog, keep_best: bool = True) -> None:
        use_ema = self.ema is not None and self.cfg.eval.ema
        with self.ema.applied(self.model) if use_ema else contextlib.nullcontext():
            self.metrics = evaluate(self.model, self.specs, self.cfg, self.env, self.eval_sets)
            log.log(self.step, {f"eval/{k}": v for k, v in self.metrics.items()})
            value = self.metrics.get(self.best_key)
            if value is None:
                raise ConfigError(f"field 'eval.best': no metric {self.best_key!r}; the tasks report "
                                  f"{', '.join(self.metrics)}")
            better = keep_best and (self.best_value is None
                                    or (value > self.best_value if self.best_higher else value < self.best_value))
            if better and math.isfinite(value) and nonfinite_tensors(self.model, self.env):
                self.progress.write(f"step {self.step}: {self.best_key} {value:.4f} not kept as best: the "
                                    f"{'EMA ' if use_ema else ''}weights are not finite")
            elif better and math.isfinite(value):
                self.best_value, self.best_step = value, self.step
                info = {"step": self.step, "metric": self.best_key, "value": value, "metrics": self.metrics,
                        "ema": use_ema}
                write = self._model_writer()
                if self.env.is_main:
                    self.ckpt.save_best(write, info)
        self.progress.write(f"eval step {self.step}: " + ", ".join(f"{k} {v:.4f}" for k, v in self.metrics.items())
                            + (" (best)" if self.best_step == self.step else ""))

    def run(self) -> RunResult:
        if self.env.is_main:
            (self.run_dir / STATUS_FILE).unlink(missing_ok=True)  # from an earlier invocation
        result = self._run()
        if self.env.is_main:
            self._write_status(result)
        return result

    def _write_status(self, result: RunResult) -> None:
        """``status.json``: how this invocation ended, for tools that read run directories."""
        def finite(v: float | None) -> float | str | None:
            return v if v is None or math.isfinite(v) else str(v)

        info = {
            "status": result.status, "step": result.step, "steps": self.cfg.train.steps,
            "message": result.message, "metrics": {k: finite(v) for k, v in result.metrics.items()},
            "nonfinite_total": result.nonfinite_total, "best_key": result.best_key,
            "best_value": finite(result.best_value), "best_step": result.best_step,
            "last_checkpoint": str(result.last_checkpoint) if result.last_checkpoint else None,
            "guard": {"mode": self.cfg.guard.mode, "recoveries": self.stability.recoveries,
                      "actions": self.stability.actions} if self.stability is not None else {"mode": "off"},
            "time": round(time.time(), 3),
        }
        write_text_atomic(self.run_dir / STATUS_FILE, json.dumps(info, indent=2) + "\n")

    def _run(self) -> RunResult:
        cfg = self.cfg
        end = min(cfg.train.steps, cfg.train.stop_at or cfg.train.steps)
        if self.step >= end:
            done = self.step >= cfg.train.steps
            return self._result("finished" if done else "stopped", f"{self.run_dir} is already at step {self.step} "
                                f"(train.steps={cfg.train.steps}); nothing to do")
        log = MetricsLog(self.run_dir, enabled=self.env.is_main, writers=cfg.log.writers,
                         resume_step=self.resumed_at)
        self.progress = Progress(enabled=cfg.log.progress, total=cfg.train.steps, initial=self.step,
                                 desc=cfg.run_name, every=cfg.log.every, main=self.env.is_main)
        if self.resumed_at is not None:
            log.event(self.step, "resume")
            for key, before, now in self.changes:  # allowed with --allow-change: on the record
                log.event(self.step, "config_change", field=key, old=before, new=now)
        self.model.train()
        saved_at = evaluated_at = None
        try:
            while self.step < end:
                record = self.train_step()
                finite = not record.get("skipped")
                phase = tuple((k, record[k]) for k in sorted(record) if k.endswith("/phase"))
                if finite:
                    self.losses.add(record["loss"], phase)
                action: dict[str, Any] = {}
                if self.stability is not None:
                    kind = tuple(k for k in record if k.startswith("loss/")) + phase  # the tasks and their phases
                    measured, action = self.stability.after_step(self.step, record["lr"], finite, record["loss"], kind)
                    record.update(measured)
                    if action:
                        self._guard(action, log)
                    if action.get("action") == "recover":
                        self.losses.rolled_back()
                if not finite and action.get("action") != "recover":
                    stop = self._nonfinite(record, log)
                    if stop is not None:
                        return stop
                else:
                    self.nonfinite_in_a_row = 0
                # a guard measurement is always logged: its series is what the guard is judged on
                if self.step % cfg.log.every == 0 or record.get("skipped") or "update/output" in record:
                    log.log(self.step, {**record, "samples": self.samples})
                self.progress.update(self.step, record["loss"], record["lr"], record["samples_per_s"])
                due_eval = cfg.eval.every and self.step % cfg.eval.every == 0
                due_save = cfg.save.every and self.step % cfg.save.every == 0 and not self.nonfinite_in_a_row
                if (due_eval or due_save) and (stop := self._nonfinite_weights(log)) is not None:
                    return stop
                if self.step >= cfg.train.steps and (why := self.losses.blown_up()) is not None:
                    return self._blown_up(why, log)  # before the last step's evaluation and save: no result, no best/
                # mid-blow-up the model is no "last good" one: it is evaluated (on the record) but neither
                # checkpointed (with save.keep the good checkpoint before it would go) nor kept as best
                above = self.losses.above() if due_eval or due_save else None
                if above is not None:
                    self.progress.write(f"step {self.step}: the training loss is blown up ({above}): "
                                        + ("not checkpointed, " if due_save else "") + "not kept as best")
                    due_save = False
                if due_eval:
                    self.evaluate(log, keep_best=above is None)
                    evaluated_at = self.step
                if due_save:
                    self.save()  # (not in a run of skipped steps: checkpoints are "last good" ones)
                    saved_at = self.step
            finished = self.step >= cfg.train.steps
            if (stop := self._nonfinite_weights(log)) is not None:  # never the last checkpoint
                return stop
            if finished and (why := self.losses.blown_up()) is not None:  # nor a blown-up model
                return self._blown_up(why, log)
            if finished and evaluated_at != self.step:
                self.evaluate(log)
            if saved_at != self.step:
                self.save()
        except KeyboardInterrupt:  # Ctrl-C: no traceback, say where to resume from
            last = self.ckpt.latest()
            return self._result("interrupted", f"interrupted at step {self.step}; last checkpoint: {last}"
                                + ("; --resume continues from it" if last else ""))
        finally:
            self.progress.close()
            log.close()
            if self.stability is not None:
                self.stability.close()
        if finished:
            return self._result("finished", f"finished at step {self.step}")
        return self._result("stopped", f"stopped at step {self.step} of {cfg.train.steps} (train.stop_at); "
                                       "resume=true continues")

    def _result(self, status: str, message: str = "") -> RunResult:
        return RunResult(status, self.step, self.run_dir, self.metrics, message, self.ckpt.latest(),
                         self.nonfinite_total, self.best_key, self.best_value, self.best_step)

    def _guard(self, action: dict[str, Any], log: MetricsLog) -> None:
        """One line and one ``guard`` event per warning (once an episode) or recovery."""
        line = describe(action, self.step, self.cfg.guard.max_recoveries)
        self.progress.write(line)
        log.event(self.step, "guard", task=None, **{k: v for k, v in action.items() if k != "step"})

    def _blown_up(self, why: str, log: MetricsLog) -> RunResult:
        last = self.ckpt.latest()
        message = (f"training ended at step {self.step} diverged: {why}; its last model was neither evaluated nor "
                   f"saved; last checkpoint: {last if last is not None else 'none'}")
        self.progress.write(message)
        log.event(self.step, "diverged", task=None, what="loss", message=message,
                  last_checkpoint=str(last) if last else None)
        return self._result("diverged", message)

    def _nonfinite_weights(self, log: MetricsLog) -> RunResult | None:
        """A "diverged" result when the weights hold NaN or inf (an optimizer step made
        them so, e.g. with a huge lr): they are not evaluated as best nor saved."""
        bad = nonfinite_tensors(self.model, self.env)
        if not bad:
            return None
        last = self.ckpt.latest()
        message = (f"training stopped at step {self.step}: the weights are not finite ({len(bad)} tensor(s) hold "
                   f"NaN or inf, e.g. {bad[0]}; optim.lr={self.cfg.optim.lr:g}); they were not saved; last good "
                   f"checkpoint: {last if last is not None else 'none (no checkpoint written yet)'}")
        self.progress.write(message)
        log.event(self.step, "diverged", task=None, what="weights", message=message,
                  last_checkpoint=str(last) if last else None)
        return self._result("diverged", message)

    def _nonfinite(self, record: dict[str, Any], log: MetricsLog) -> RunResult | None:
        self.nonfinite_in_a_row += 1
        self.nonfinite_total += 1
        task, what = record["bad_task"], record["bad_what"]
        loss = record.get(f"loss/{task}", record["loss"])
        self.progress.write(
            f"step {self.step}: non-finite {what} in task {task!r} (loss {loss}, grad norm {record['grad_norm']}); "
            f"step skipped ({self.nonfinite_in_a_row} in a row, {self.nonfinite_total} in all)"
        )
        log.event(self.step, "nonfinite", task=task, what=what, loss=loss, grad_norm=record["grad_norm"],
                  in_a_row=self.nonfinite_in_a_row, total=self.nonfinite_total)
        if self.nonfinite_in_a_row < self.cfg.train.max_nonfinite:
            return None
        last = self.ckpt.latest()
        message = (
            f"training stopped at step {self.step}: {self.nonfinite_in_a_row} non-finite steps in a row "
            f"(train.max_nonfinite={self.cfg.train.max_nonfinite}), the last one a non-finite {what} in task "
            f"{task!r}; last good checkpoint: {last if last is not None else 'none (no checkpoint written yet)'}"
        )
        log.event(self.step, "diverged", task=task, what=what, message=message,
                  last_checkpoint=str(last) if last else None)
        return self._result("diverged", message)


def train(cfg: TrainConfig, specs: list[TaskSpec] | None = None) -> RunResult:
    """Run (or resume) the training that ``cfg`` describes, in this process group. The run
    directory is locked throughout; a failure once it is this run's is recorded there
    (status.json "failed", error.log) and raised again."""
    if specs is None:
        cfg, specs = resolve(cfg)
    if cfg.init_from is not None:  # a backbone of another width, depth, rule ...: say so before any work
        check_init_from(cfg.backbone, cfg.init_from)
    env = distributed.setup(cfg.device)
    try:
        with RunDir(cfg.run_dir, env) as run_dir, distributed.deterministic(cfg.train.deterministic):
            trainer = None
            try:
                trainer = Trainer(cfg, specs, env, run_dir)
                return trainer.run()
            except Exception as e:
                run_dir.record_failure(e, trainer.step if trainer is not None else None, cfg.train.steps)
                raise
    finally:
        distributed.teardown(env)
