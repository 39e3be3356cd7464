"""Shared by the studies' tests: a toy seq2seq recipe that trains in seconds on the CPU."""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf


def toy_recipe(steps: int = 6, tasks: list | None = None, eval_every: int = 3, **train) -> dict:
    """A 1-layer encoder-decoder on a tiny seq2seq task (``tasks``: its entries instead)."""
    return {
        "run_name": "toy",
        "seed": 0,
        "backbone": {"arch": "encoder_decoder", "norm": "magneto", "dim": 16, "depth": 1, "heads": 2, "ffn_dim": 32},
        "tasks": tasks or [seq2seq_task()],
        "optim": {"lr": 3e-3},
        "schedule": {"warmup_steps": 1},
        "train": {"steps": steps, "batch_size": 8, **train},
        "eval": {"every": eval_every, "batch_size": 16},
        "save": {"every": 0, "keep": 1},
        "log": {"progress": False, "writers": ["jsonl"]},
    }


def seq2seq_task(**fields) -> dict:
    return {"name": "seq2seq", "vocab_size": 6, "min_len": 2, "max_len": 4, "train_size": 64, "eval_size": 16, **fields}


def write_yaml(path: Path, cfg: dict) -> Path:
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    return path


@pytest.fixture
def toy():
    """``toy(steps, tasks=None, eval_every=3, **train)``: the toy recipe as a dict."""
    return toy_recipe


@pytest.fixture
def seq2seq():
    """``seq2seq(**fields)``: one seq2seq task entry of the toy recipe."""
    return seq2seq_task


@pytest.fixture
def write_config(tmp_path):
    """``write_config(cfg, name="toy.yaml")``: the config as YAML in tmp_path; its path."""
    return lambda cfg, name="toy.yaml": write_yaml(tmp_path / name, cfg)


@pytest.fixture
def nan_losses(monkeypatch):
    """``nan_losses(norm, from_call)``: training losses of seq2seq models whose
    ``backbone.config.norm == norm`` are NaN from their ``from_call``-th training forward on
    (evaluation does not call forward); in-process runs only."""
    from foundation_tasks.seq2seq.model import Seq2SeqHead

    real = Seq2SeqHead.forward

    def install(norm: str, from_call: int) -> None:
        calls: dict[int, int] = {}

        def forward(self, backbone, batch):
            loss, logs = real(self, backbone, batch)
            if backbone.config.norm != norm:
                return loss, logs
            calls[id(self)] = calls.get(id(self), 0) + 1
            return (loss * float("nan") if calls[id(self)] >= from_call else loss), logs

        monkeypatch.setattr(Seq2SeqHead, "forward", forward)

    return install
