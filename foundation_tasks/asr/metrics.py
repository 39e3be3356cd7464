"""Word and character error rates per evaluation split, from sums the engine adds up."""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import editdistance
import torch


def error_counts(refs: Sequence[str], hyps: Sequence[str]) -> dict[str, float]:
    """Edit distances (substitutions + deletions + insertions) over words and characters."""
    out = {"word_errors": 0.0, "words": 0.0, "char_errors": 0.0, "chars": 0.0, "utts": 0.0, "utt_errors": 0.0}
    for ref, hyp in zip(refs, hyps):
        r, h = ref.split(), hyp.split()
        out["word_errors"] += editdistance.eval(r, h)
        out["words"] += len(r)
        rc, hc = " ".join(r), " ".join(h)
        out["char_errors"] += editdistance.eval(rc, hc)
        out["chars"] += len(rc)
        out["utts"] += 1
        out["utt_errors"] += float(r != h)
    return out


def split_sums(splits: Sequence[str], split_of: Sequence[int], refs: Sequence[str], hyps: Sequence[str],
               loss_sum: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every key for every split (zeros where this batch has none): ranks must all-reduce
    the same keys."""
    out: dict[str, torch.Tensor] = {"loss_sum": loss_sum.detach().double()}
    for k, name in enumerate(splits):
        mine = [i for i, s in enumerate(split_of) if s == k]
        counts = error_counts([refs[i] for i in mine], [hyps[i] for i in mine])
        out.update({f"{key}/{name}": torch.tensor(v, dtype=torch.float64) for key, v in counts.items()})
    return out


def asr_metrics(splits: Sequence[str], totals: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """``wer_<split>``, ``cer_<split>`` and ``ser_<split>`` (sentences) in percent, ``wer`` of the first split (the one
    that picks the best checkpoint), ``loss`` (RNN-T, per utterance, all splits)."""
    def rate(errors: str, count: str) -> float:  # NaN for a split this evaluation did not reach
        n = float(totals[count])
        return 100.0 * float(totals[errors]) / n if n else math.nan

    out: dict[str, float] = {}
    utts = 0.0
    for name in splits:
        out[f"wer_{name}"] = rate(f"word_errors/{name}", f"words/{name}")
        out[f"cer_{name}"] = rate(f"char_errors/{name}", f"chars/{name}")
        out[f"ser_{name}"] = rate(f"utt_errors/{name}", f"utts/{name}")
        utts += float(totals[f"utts/{name}"])
    out["wer"] = out[f"wer_{splits[0]}"]
    out["loss"] = float(totals["loss_sum"]) / max(utts, 1.0)
    return out
