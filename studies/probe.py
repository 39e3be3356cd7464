"""The DeepNet model-update measurement: how far one training step moves the model's output.

DeepNet (papers/deepnet.txt, Sec. 2 eq. 1 and Fig. 3/4) tracks, early in training,

    ||Delta F||_2 = ||F(x; theta_t) - F(x; theta_0)||_2

on 64-128-2 encoder-decoder Transformers from 6L-6L to 100L-100L trained with Adam and
no warm-up: Post-LN's update grows with depth (each of the 2N + 3M sub-layers adds its
own, Theorem 3), DeepNorm's stays roughly constant (alpha, beta bound it, Sec. 3.3), and
Magneto bounds it the same way for Sub-LN (papers/magneto.txt Sec. 3.2).

Here F is the logits of a tiny translation model - shared token embedding, sinusoidal
positions, the encoder-decoder ``Backbone`` and an output projection, i.e. Magneto's
``F(x) = W^vocab x^e`` (eq. 6) - on a fixed probe batch, and the norm is the L2 norm
over the whole (batch, length, vocab) tensor. The task is the reversal of random token
sequences, generated from the seed, so every norm and depth sees the same batches.

``foundation probe update`` runs the grid and writes ``updates.csv``, ``updates.md`` and
``update.png`` (one panel per norm, one curve per depth, as DeepNet Fig. 4).

The default is the setting of the papers' theorems: plain SGD (lr 5e-3) with the LayerNorm
gains/biases kept at 1/0. There, with 6L..100L, Post-LN's update grows ~8x with depth, DeepNorm's
is flat and ~30x smaller, and Magneto's stays within 2x of its 6L value.

With ``--optimizer adam --train-ln`` (Adam, lr 5e-5, 6L..100L): Post-LN's first-step update
grows about linearly with depth until the output has changed completely (the ceiling,
about sqrt(2) ||F(x; theta_0)||); DeepNorm's is 8-18x smaller at every depth but still
grows, about as sqrt(depth); Magneto's levels off beyond 18L. DeepNorm grows because of two
things outside the papers' SGD analysis: Adam's per-parameter step does not shrink with
beta, and LayerNorm gains/biases (parameter-free in the analysis) add updates that pile up
along DeepNorm's near-identity shortcut. Without those two
(the default), DeepNorm's update is flat across depth. The default lr is 10x below
DeepNet's 5e-4 because at 5e-4 a single Adam step already takes Post-LN 6L-6L to the ceiling
in this tiny model, which hides the depth trend.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from foundation.config import BackboneConfig, ConfigError
from foundation.scaling import NORMS
from foundation.transformer import Backbone

BOS = 1  # decoder start token; 0 is unused, data tokens are 2..vocab-1
FIRST_TOKEN = 2


class ReversalModel(nn.Module):
    """Token embedding (shared by both sides, scaled by sqrt(dim) as in fairseq) plus
    sinusoidal positions -> encoder-decoder ``Backbone`` -> output projection."""

    def __init__(self, cfg: BackboneConfig, vocab: int, max_len: int = 256):
        super().__init__()
        self.embed = nn.Embedding(vocab, cfg.dim)
        nn.init.normal_(self.embed.weight, std=cfg.dim**-0.5)
        self.backbone = Backbone(cfg)
        self.head = nn.Linear(cfg.dim, vocab, bias=False)
        nn.init.normal_(self.head.weight, std=cfg.dim**-0.5)
        self.register_buffer("pos", sinusoidal_positions(max_len, cfg.dim), persistent=False)
        self.scale = math.sqrt(cfg.dim)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed(tokens) * self.scale + self.pos[: tokens.shape[1]]

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(self.embed_tokens(src), decoder_x=self.embed_tokens(tgt_in))
        return self.head(hidden)


def sinusoidal_positions(n: int, dim: int) -> torch.Tensor:
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    out = torch.zeros(n, dim)
    out[:, 0::2], out[:, 1::2] = torch.sin(pos * freq), torch.cos(pos * freq)
    return out


def reversal_batch(gen: torch.Generator, batch: int, length: int, vocab: int):
    """(src, decoder input, target): the target is src reversed; the decoder reads it
    shifted right behind BOS (teacher forcing)."""
    src = torch.randint(FIRST_TOKEN, vocab, (batch, length), generator=gen)
    tgt = src.flip(1)
    tgt_in = torch.cat([torch.full((batch, 1), BOS), tgt[:, :-1]], dim=1)
    return src, tgt_in, tgt


class UpdateTrace(NamedTuple):
    updates: list[float]  # ||F(x; theta_t) - F(x; theta_0)||_2 for t = 0..steps (0 at t=0)
    losses: list[float]  # training loss of steps 1..steps (measured before that step's update)


def trace_update(
    norm: str,
    depth: int,
    steps: int = 10,
    *,
    lr: float = 5e-3,
    warmup: int = 0,
    optimizer: str = "sgd",
    train_ln: bool = False,
    dim: int = 64,
    ffn_dim: int | None = None,
    heads: int = 2,
    seed: int = 0,
    batch: int = 32,
    length: int = 12,
    vocab: int = 32,
) -> UpdateTrace:
    """Train a ``depth``L-``depth``L model (SGD or Adam, constant lr, no warm-up unless asked) for
    ``steps`` steps and record the update of its logits on a fixed probe batch after each.

    ``optimizer="sgd"`` and ``train_ln=False`` (LayerNorm gains and biases frozen at 1 and 0)
    reproduce the setting of DeepNet's and Magneto's bounds, which treat LN as parameter-free.
    """
    if steps < 1 or depth < 1:
        raise ValueError(f"steps and depth must be >= 1, got steps={steps}, depth={depth}")
    cfg = BackboneConfig(
        dim=dim, ffn_dim=2 * dim if ffn_dim is None else ffn_dim, heads=heads, depth=depth,
        decoder_depth=depth, arch="encoder_decoder", norm=norm,
    )
    torch.manual_seed(seed)
    model = ReversalModel(cfg, vocab, max_len=length)
    # Training batches and the probe batch come from their own generators (the probe's on a
    # separate seed), so every norm and depth sees the same data.
    data = torch.Generator().manual_seed(seed)
    probe_gen = torch.Generator().manual_seed(seed + 10_000)
    probe_src, probe_in, _ = reversal_batch(probe_gen, batch, length, vocab)
    if not train_ln:
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    if optimizer == "adam":
        opt = torch.optim.Adam(params, lr=lr, betas=(0.9, 0.98))  # fairseq's MT betas
    elif optimizer == "sgd":  # the optimizer DeepNet's and Magneto's bounds are derived for
        opt = torch.optim.SGD(params, lr=lr)
    else:
        raise ValueError(f"optimizer must be adam or sgd, got {optimizer!r}")
    # step t (from 1) runs at lr * min(1, t / warmup)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: min(1.0, (t + 1) / warmup) if warmup else 1.0)

    @torch.no_grad()
    def logits() -> torch.Tensor:
        return model(probe_src, probe_in)  # no dropout in this model: train mode is deterministic

    f0 = logits()
    updates, losses = [0.0], []
    for _ in range(steps):
        src, tgt_in, tgt = reversal_batch(data, batch, length, vocab)
        loss = F.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        schedule.step()
        losses.append(loss.item())
        updates.append((logits() - f0).norm().item())
    return UpdateTrace(updates, losses)


def model_update(norm: str, depth: int, steps: int = 10, **kwargs) -> list[float]:
    """||F(x; theta_t) - F(x; theta_0)||_2 for t = 0..steps; keywords as ``trace_update``."""
    return trace_update(norm, depth, steps, **kwargs).updates


# --- the grid, its table and its plot -------------------------------------------------

def table_steps(steps: int) -> list[int]:
    """The steps shown in the markdown table: 1, 2, 5, 10, 20, 50, ... and the last."""
    shown = [s for s in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if s < steps]
    return shown + [steps]


def markdown_table(results: dict[tuple[str, int], UpdateTrace], steps: int) -> str:
    """One row per (norm, depth): the update at chosen steps, its maximum, and the step-1
    update divided by that norm's step-1 update at its shallowest depth."""
    cols = table_steps(steps)
    header = ["norm", "depth", *(f"step {s}" for s in cols), "max", "step 1 / shallowest", "loss 1 -> last"]
    lines = ["| " + " | ".join(header) + " |", "|---|---:|" + "---:|" * (len(cols) + 2) + "---|"]
    for (norm, depth), tr in results.items():
        shallowest = min(d for n, d in results if n == norm)
        base = results[norm, shallowest].updates[1]
        ratio = tr.updates[1] / base if base > 0 else float("nan")
        cells = [norm, f"{depth}L-{depth}L"] + [f"{tr.updates[s]:.3g}" for s in cols]
        cells += [f"{max(tr.updates):.3g}", f"{ratio:.2f}x", f"{tr.losses[0]:.2f} -> {tr.losses[-1]:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csv(results: dict[tuple[str, int], UpdateTrace], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["norm", "depth", "step", "update", "loss"])
        for (norm, depth), tr in results.items():
            for step, u in enumerate(tr.updates):
                w.writerow([norm, depth, step, f"{u:.6g}", f"{tr.losses[step - 1]:.6g}" if step else ""])


def plot_updates(results: dict[tuple[str, int], UpdateTrace], path: Path, title: str = "") -> None:
    """One panel per norm, one curve per depth, shared log-y axis (as DeepNet Fig. 4)."""
    from studies.plots import pyplot

    plt = pyplot()
    norms = list(dict.fromkeys(n for n, _ in results))
    depths = sorted({d for _, d in results})
    colors = {d: plt.cm.viridis(i / max(1, len(depths) - 1) * 0.9) for i, d in enumerate(depths)}
    fig, axes = plt.subplots(1, len(norms), figsize=(3.6 * len(norms), 3.4), sharey=True, squeeze=False)
    for ax, norm in zip(axes[0], norms):
        for depth in depths:
            if (norm, depth) not in results:
                continue
            u = results[norm, depth].updates
            ax.plot(range(1, len(u)), u[1:], color=colors[depth], label=f"{depth}L-{depth}L")
        ax.set_yscale("log")
        ax.set_title(norm)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel(r"$\|F(x;\theta_t) - F(x;\theta_0)\|_2$ (logits)")
    axes[0][-1].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def comma_list(kind: type):
    def parse(text: str) -> list:
        return [kind(t) for t in text.split(",") if t.strip()]
    return parse


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="foundation probe update",
        description="DeepNet's model-update measurement (Sec. 2 eq. 1, Fig. 4): train tiny "
        "encoder-decoder Transformers on sequence reversal from one seed and record "
        "||F(x; theta_t) - F(x; theta_0)||_2 of the logits on a fixed probe batch per step.",
    )
    ap.add_argument("--norms", type=comma_list(str), default=["postln", "preln", "deepnorm", "magneto"],
                    help="comma-separated, from %s" % ", ".join(NORMS))
    ap.add_argument("--depths", type=comma_list(int), default=[6, 18, 50, 100],
                    help="comma-separated N for NL-NL models (default 6,18,50,100)")
    ap.add_argument("--steps", type=int, default=10, help="training steps per model (default 10)")
    ap.add_argument("--lr", type=float, default=None,
                    help="constant learning rate (default 5e-3 for sgd, 5e-5 for adam)")
    ap.add_argument("--warmup", type=int, default=0, help="linear warm-up steps (default 0: none)")
    ap.add_argument("--optimizer", choices=("adam", "sgd"), default="sgd",
                    help="sgd (default: the setting of the papers' theorems) or adam (betas 0.9, 0.98)")
    ap.add_argument("--train-ln", action="store_true",
                    help="also train LayerNorm gains/biases (the papers' analysis keeps them at 1/0)")
    ap.add_argument("--dim", type=int, default=64, help="model width (default 64)")
    ap.add_argument("--ffn-dim", type=int, default=None, help="default 2 * dim (64-128-2 as DeepNet)")
    ap.add_argument("--heads", type=int, default=2, help="attention heads (default 2)")
    ap.add_argument("--batch", type=int, default=32, help="sequences per training and probe batch")
    ap.add_argument("--length", type=int, default=12, help="tokens per sequence")
    ap.add_argument("--vocab", type=int, default=32, help="vocabulary size incl. 2 special ids (default 32)")
    ap.add_argument("--seed", type=int, default=0, help="one seed for every model and batch (default 0)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: these models are too small to gain from more, "
                    "and a shared CPU slows down badly when oversubscribed; 0 = torch's default)")
    ap.add_argument("--out", type=Path, default=Path("runs/probe_update"),
                    help="folder for updates.csv, updates.md, update.png (default runs/probe_update)")
    args = ap.parse_args(argv)
    if args.lr is None:
        args.lr = 5e-3 if args.optimizer == "sgd" else 5e-5
    for norm in args.norms:
        if norm not in NORMS:
            ap.error(f"--norms: unknown norm {norm!r}; known: {', '.join(NORMS)}")
    if not args.norms or not args.depths or min(args.depths) < 1 or args.steps < 1 or args.warmup < 0:
        ap.error("--norms and --depths must be non-empty, depths and --steps >= 1, --warmup >= 0")
    if args.vocab <= FIRST_TOKEN or args.length < 1 or args.batch < 1:
        ap.error(f"--vocab must be > {FIRST_TOKEN} (ids 0, 1 are special), --length and --batch >= 1")
    try:  # the model size is checked before anything trains
        BackboneConfig(dim=args.dim, ffn_dim=args.ffn_dim, heads=args.heads, arch="encoder_decoder")
    except ConfigError as e:
        ap.error(str(e))
    if args.threads:
        torch.set_num_threads(args.threads)

    settings = dict(
        lr=args.lr, warmup=args.warmup, optimizer=args.optimizer, train_ln=args.train_ln,
        dim=args.dim, ffn_dim=args.ffn_dim, heads=args.heads, seed=args.seed, batch=args.batch,
        length=args.length, vocab=args.vocab,
    )
    ffn = args.ffn_dim or 2 * args.dim
    about = (f"{args.dim}-{ffn}-{args.heads} encoder-decoder, sequence reversal, {args.optimizer} "
             f"lr {args.lr:g}, warm-up {args.warmup}, batch {args.batch}x{args.length}, seed {args.seed}"
             + ("" if args.train_ln else ", LayerNorm affine frozen"))
    print(f"model update ||F(x;theta_t) - F(x;theta_0)||_2 of the logits: {about}", flush=True)
    results: dict[tuple[str, int], UpdateTrace] = {}
    start = time.time()
    for norm in args.norms:
        for depth in sorted(args.depths):
            t0 = time.time()
            tr = results[norm, depth] = trace_update(norm, depth, args.steps, **settings)
            print(f"{norm:>9} {depth:>4}L-{depth}L  step 1 {tr.updates[1]:9.3g}  max {max(tr.updates):9.3g}  "
                  f"loss {tr.losses[0]:.2f} -> {tr.losses[-1]:.2f}  ({time.time() - t0:.1f}s)", flush=True)

    table = markdown_table(results, args.steps)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(results, args.out / "updates.csv")
    command = "foundation probe update " + " ".join(sys.argv[1:] if argv is None else argv)
    (args.out / "updates.md").write_text(
        f"# Model update, {about}\n\n`{command.strip()}` ({time.time() - start:.0f} s)\n\n"
        "F = logits on a fixed probe batch; L2 norm over (batch, length, vocab).\n\n" + table + "\n"
    )
    plot_updates(results, args.out / "update.png", title=about)
    print("\n" + table)
    print(f"\nwrote {args.out}/updates.csv, updates.md, update.png ({time.time() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
