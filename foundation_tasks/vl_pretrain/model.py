"""BEiT-3's masked data modeling head: predict masked text tokens (MLM) and the visual
tokens of masked patches (MIM) from the multiway backbone's outputs, cross-entropy each (or,
with the ``pixels`` target, the masked patches' normalised pixels, mean squared error).

The MLM output is tied to the text embedding (as BERT, plus a bias); the MIM output is a
Linear over the visual vocabulary (or onto a patch's pixels). A BEiT-3 has one of each, so
the text, image and pair heads of a model share them (through ``VLTask.shared``) as they
share the embedding."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from foundation_tasks.vl_common.beit3 import BEiT3Embedding, Pooler, init_head


class MLMOutput(nn.Module):
    def __init__(self, vocab_size: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, hidden: torch.Tensor, embed: BEiT3Embedding) -> torch.Tensor:
        return F.linear(hidden, embed.text_embed.weight, self.bias)


class MIMOutput(nn.Module):
    def __init__(self, dim: int, visual_tokenizer: nn.Module):
        super().__init__()
        self.visual_tokenizer = visual_tokenizer  # targets: one id per patch
        self.proj = nn.Linear(dim, visual_tokenizer.vocab_size)
        init_head(self.proj)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden)


class MatchOutput(nn.Module):
    """Image-text matching: BEiT-3's pooler (as its VQA head) on the first token, then two logits
    (another image's caption, its own)."""

    def __init__(self, dim: int, std: float = 0.02):
        super().__init__()
        self.pooler = Pooler(dim)
        self.proj = nn.Linear(dim, 2)
        init_head(self, std=std)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(self.pooler(hidden))


class MDMHead(nn.Module):
    """A head for one kind of batch: ``mlm`` for texts, ``mim`` for images, both for pairs,
    ``match`` for image-text matching. ``word`` (pairs): a pooler whose output, through the MLM
    output, also names each pair's first masked word from the class token, the token VQA and
    NLVR2 read; masked words at their own positions leave it untrained."""

    def __init__(self, embed: BEiT3Embedding, mlm: MLMOutput | None, mim: MIMOutput | None,
                 match: MatchOutput | None = None, word: Pooler | None = None):
        super().__init__()
        self.embed, self.mlm, self.mim, self.match, self.word = embed, mlm, mim, match, word

    def predict(self, backbone: nn.Module, batch: dict) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """{"mlm" / "mim": (logits of the masked positions, their targets), "word": (the class token's logits,
        each pair's first masked word)} or {"itm": (logits, labels)}."""
        text, images = batch.get("text_ids"), batch.get("images")
        x, padding, segments = self.embed(text_ids=text, text_padding_mask=batch.get("text_padding_mask"),
                                          images=images, vision_mask=batch.get("vision_mask"))
        hidden = backbone(x, padding, segments=segments)
        if self.match is not None:
            return {"itm": (self.match(hidden), batch["match_labels"])}
        out = {}
        if self.word is not None:
            masked = batch["text_masked"]
            rows = masked.any(1)  # every pair masks at least one word; kept general
            first = masked.float().argmax(1)
            target = batch["text_targets"][torch.arange(len(first), device=first.device), first]
            out["word"] = (self.mlm(self.word(hidden)[rows], self.embed), target[rows])
        if images is not None:
            n, masked = self.embed.num_vision_tokens, batch["vision_mask"]
            out["mim"] = (self.mim(hidden[:, 1:n][masked]), self.mim.visual_tokenizer(images)[masked])
            hidden = hidden[:, n:]
        if text is not None:
            masked = batch["text_masked"]
            out["mlm"] = (self.mlm(hidden[masked], self.embed), batch["text_targets"][masked])
        return out

    def forward(self, backbone: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        loss, logs = 0.0, {}
        for name, (logits, targets) in self.predict(backbone, batch).items():
            if targets.is_floating_point():  # the pixels target
                part = F.mse_loss(logits.float(), targets)
            else:
                part = F.cross_entropy(logits.float(), targets)
                logs[f"{name}_acc"] = (logits.argmax(-1) == targets).float().mean().detach()
            loss = loss + part
            logs[f"{name}_loss"] = part.detach()
        return loss, logs

    def no_weight_decay(self) -> list[str]:
        return [f"embed.{n}" for n in self.embed.no_weight_decay()] + (["mlm.bias"] if self.mlm is not None else [])
