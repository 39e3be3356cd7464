"""A plain PyTorch Transformer-Transducer on the speech demo corpus, to hold the tiny ASR
recipe against: the same data, features, CMVN statistics, tokenizer and length buckets as
`configs/asr/tiny_*.yaml`, but torch's own modules only (``nn.TransformerEncoder`` with
Pre-LN and sinusoidal positions, ``nn.LSTM`` predictor, a tanh joint), torchaudio's
RNN-T loss plus CTC (weight 0.5), AdamW with linear warmup and decay, greedy decoding.

    foundation data make speech --out data/speech-demo
    foundation train configs/asr/tiny.yaml backbone.norm=preln # once: writes the tokenizer + CMVN stats it reads
    OMP_NUM_THREADS=1 python benchmarks/asr_reference.py --steps 1200 --lr 4e-3

Prints the greedy WER on dev and test (held-out voices) and the time.
"""
from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class Reference(nn.Module):
    def __init__(self, vocab: int, dim: int = 144, depth: int = 6, heads: int = 4, ffn: int = 576, mels: int = 80,
                 frontend: str = "conv2d", vgg_channels: tuple[int, int] = (8, 32)):
        super().__init__()
        if frontend == "conv2d":  # two stride-2 conv layers: 10 ms -> 40 ms frames
            out_channels = 32
            self.subsample = nn.Sequential(nn.Conv2d(1, 32, 3, 2, 1), nn.ReLU(), nn.Conv2d(32, 32, 3, 2, 1), nn.ReLU())
        elif frontend == "vgg":  # the recipe's (ESPnet's VGG2L): two conv-conv-pool blocks, the same 4x
            c1, out_channels = vgg_channels
            self.subsample = nn.Sequential(
                nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(), nn.Conv2d(c1, c1, 3, padding=1), nn.ReLU(),
                nn.MaxPool2d(2, ceil_mode=True),
                nn.Conv2d(c1, out_channels, 3, padding=1), nn.ReLU(),
                nn.Conv2d(out_channels, out_channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True))
        else:
            raise ValueError(f"frontend: conv2d or vgg (got {frontend!r})")
        self.proj = nn.Linear(out_channels * math.ceil(math.ceil(mels / 2) / 2), dim)
        layer = nn.TransformerEncoderLayer(dim, heads, ffn, 0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, norm=nn.LayerNorm(dim), enable_nested_tensor=False)
        self.embed = nn.Embedding(vocab, 64)
        self.lstm = nn.LSTM(64, dim, 2, batch_first=True)
        self.lin_enc, self.lin_dec, self.out = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, vocab)
        self.ctc = nn.Linear(dim, vocab)

    def encode(self, x: torch.Tensor, lens: torch.Tensor):
        x = self.subsample(x[:, None]).permute(0, 2, 1, 3).flatten(2)
        lens = (lens + 1) // 2
        lens = (lens + 1) // 2
        T, D = x.shape[1], self.proj.out_features
        pos = torch.arange(T)[:, None] * torch.exp(torch.arange(0, D, 2) * (-math.log(1e4) / D))
        pe = torch.zeros(T, D)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos), torch.cos(pos)
        x = self.proj(x) * math.sqrt(D) + pe  # ESPnet's scaled embedding + positions
        pad = torch.arange(T)[None] >= lens[:, None]
        return self.encoder(x, src_key_padding_mask=pad), lens

    def loss(self, feats, feat_lens, targets, tgt_lens):
        import torchaudio.functional as AF

        enc, lens = self.encode(feats, feat_lens)
        dec, _ = self.lstm(self.embed(F.pad(targets, (1, 0))))
        logits = self.out(torch.tanh(self.lin_enc(enc)[:, :, None] + self.lin_dec(dec)[:, None]))
        rnnt = AF.rnnt_loss(logits, targets.int(), lens.int(), tgt_lens.int(), blank=0, reduction="sum")
        ctc = F.ctc_loss(self.ctc(enc).log_softmax(-1).transpose(0, 1), targets, lens, tgt_lens, zero_infinity=True,
                         reduction="sum")
        return (rnnt + 0.5 * ctc) / feats.shape[0]

    @torch.no_grad()
    def greedy(self, feats, feat_lens, max_symbols: int = 5) -> list[list[int]]:
        enc, lens = self.encode(feats, feat_lens)
        hyps = []
        for b in range(enc.shape[0]):
            ids, state = [], None
            dec, state = self.lstm(self.embed(torch.zeros(1, 1, dtype=torch.long)), state)
            for t in range(int(lens[b])):
                for _ in range(max_symbols):
                    k = int(self.out(torch.tanh(self.lin_enc(enc[b, t]) + self.lin_dec(dec[0, 0]))).argmax())
                    if k == 0:
                        break
                    ids.append(k)
                    dec, state = self.lstm(self.embed(torch.tensor([[k]])), state)
            hyps.append(ids)
        return hyps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/asr/tiny.yaml", help="where the data, tokenizer, buckets come from")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--lr", type=float, default=4e-3)
    p.add_argument("--warmup", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--frontend", choices=["conv2d", "vgg"], default="conv2d",
                   help="vgg: the recipe's front end (its vgg_channels), for a like-for-like model")
    a = p.parse_args(argv)
    from foundation.engine.config import load_config
    from foundation_tasks.asr.metrics import error_counts  # the recipe's WER, so both are scored alike
    from foundation.engine.model import ModelConfig, MultiTaskModel

    torch.manual_seed(a.seed)
    random.seed(a.seed)
    cfg, specs = load_config(a.config, [])
    task = MultiTaskModel(ModelConfig.from_specs(cfg.backbone, specs)).tasks["asr"]  # data, tokenizer, buckets only
    stats = np.load(task.cfg.stats_path)
    mean = torch.tensor(stats["sum"] / stats["count"], dtype=torch.float32)
    std = torch.tensor(np.sqrt(stats["sum_square"] / stats["count"] - (stats["sum"] / stats["count"]) ** 2),
                       dtype=torch.float32)
    train = task.train_dataset()
    model = Reference(task.tokenizer.size, mels=task.cfg.num_mel_bins, frontend=a.frontend,
                      vgg_channels=tuple(task.cfg.vgg_channels))
    opt = torch.optim.AdamW(model.parameters(), a.lr, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / a.warmup, max(0.0, (a.steps - s) / max(1, a.steps - a.warmup))))

    def batch_of(bucket):
        b = task.collate([bucket])
        x = (b["feats"] - mean) / std
        x = x.masked_fill(torch.arange(x.shape[1])[None, :, None] >= b["feat_lens"][:, None, None], 0.0)
        return b, x

    start, order = time.perf_counter(), []
    for step in range(1, a.steps + 1):
        if not order:
            order = list(range(len(train)))
            random.shuffle(order)
        b, x = batch_of(train[order.pop()])
        loss = model.loss(x, b["feat_lens"], b["targets"], b["target_lens"])
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0:
            print(f"step {step} loss {loss.item():.2f} ({time.perf_counter() - start:.0f} s)", flush=True)
    train_s = time.perf_counter() - start
    model.eval()
    evals = task.eval_dataset()
    refs: dict[str, list[str]] = {s: [] for s in task.cfg.eval_splits}
    hyps: dict[str, list[str]] = {s: [] for s in task.cfg.eval_splits}
    for i in range(len(evals)):
        b, x = batch_of(evals[i])
        for s, text, ids in zip(b["split"].tolist(), b["texts"], model.greedy(x, b["feat_lens"])):
            refs[task.cfg.eval_splits[s]].append(text)
            hyps[task.cfg.eval_splits[s]].append(task.tokenizer.decode(ids))
    counts = {s: error_counts(refs[s], hyps[s]) for s in refs}
    wers = ", ".join(f"{s} {100 * c['word_errors'] / max(1.0, c['words']):.1f}" for s, c in counts.items())
    print(f"plain PyTorch T-T, {a.steps} steps, lr {a.lr}: greedy WER {wers} (training {train_s:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
