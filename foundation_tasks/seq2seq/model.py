"""Token embeddings in, next-token logits out, around an encoder-decoder backbone."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from foundation.embed import TextEmbedding
from foundation_tasks.seq2seq.data import BOS, EOS, PAD


class Seq2SeqHead(nn.Module):
    """Shared source/target token embedding, output projection, cross-entropy loss."""

    def __init__(self, num_tokens: int, dim: int, max_positions: int, label_smoothing: float = 0.0):
        super().__init__()
        self.embed = TextEmbedding(num_tokens, dim, max_positions, padding_idx=PAD)
        self.out = nn.Linear(dim, num_tokens)
        self.label_smoothing = label_smoothing

    def logits(self, backbone: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        memory = backbone.encode(self.embed(batch["src"]), batch["src_pad"])
        hidden = backbone.decode(self.embed(batch["dec_in"]), memory, batch["src_pad"], batch["dec_pad"])
        return self.out(hidden)

    def forward(self, backbone: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        logits = self.logits(backbone, batch)
        labels = batch["labels"]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=PAD,
                               label_smoothing=self.label_smoothing)
        real = labels != PAD
        token_acc = ((logits.argmax(-1) == labels) & real).sum() / real.sum()
        return loss, {"token_acc": token_acc.detach()}

    @torch.no_grad()
    def greedy(self, backbone: nn.Module, src: torch.Tensor, src_pad: torch.Tensor, max_len: int) -> torch.Tensor:
        """(B, max_len) greedy decoding; positions after EOS are PAD."""
        memory = backbone.encode(self.embed(src), src_pad)
        out = torch.full((src.shape[0], 1), BOS, dtype=torch.long, device=src.device)
        done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
        for _ in range(max_len):
            hidden = backbone.decode(self.embed(out), memory, src_pad)
            nxt = self.out(hidden[:, -1]).argmax(-1).masked_fill(done, PAD)
            out = torch.cat([out, nxt[:, None]], dim=1)
            done |= nxt == EOS
            if done.all():
                break
        pred = out[:, 1:]
        return torch.nn.functional.pad(pred, (0, max_len - pred.shape[1]), value=PAD)
