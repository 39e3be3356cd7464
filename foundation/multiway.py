"""Multiway (modality-expert) modules, as in BEiT-3 / VLMo.

A ``Multiway`` holds one copy of a module per expert. Which tokens go to which expert is
given on every call as ``segments``: a list of ``(expert_name, length)`` covering the
sequence in order. Nothing about the split is kept between calls (torchscale's
``MultiwayNetwork`` keeps a sticky ``split_position`` instead).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from torch import nn

Segments = Sequence[tuple[str, int]]


class Multiway(nn.ModuleDict):
    def __init__(self, experts: Sequence[str], make: Callable[[], nn.Module]):
        super().__init__({name: make() for name in experts})

    def forward(self, x: torch.Tensor, segments: Segments) -> torch.Tensor:
        if len(segments) == 1:  # one modality: no split, no copy
            return self[segments[0][0]](x)
        parts = x.split([n for _, n in segments], dim=1)
        return torch.cat([self[name](p) for (name, _), p in zip(segments, parts)], dim=1)


def per_expert(experts: Sequence[str], make: Callable[[], nn.Module]) -> nn.Module:
    """``make()`` itself for a single-modality model, else one copy per expert."""
    return Multiway(experts, make) if experts else make()


def route(module: nn.Module, x: torch.Tensor, segments: Segments | None) -> torch.Tensor:
    """Call ``module`` on ``x``, splitting by ``segments`` when it is multiway."""
    if isinstance(module, Multiway):
        return module(x, segments)
    return module(x)


def merge_segments(segments: Segments) -> list[tuple[str, int]]:
    """Drop empty segments and join neighbours of the same expert."""
    out: list[tuple[str, int]] = []
    for name, n in segments:
        if n == 0:
            continue
        if out and out[-1][0] == name:
            out[-1] = (name, out[-1][1] + n)
        else:
            out.append((name, n))
    return out


# --------------------------------------------------------------------------- state dicts across layouts

_FFN_EXPERT = re.compile(r"(?:^|\.)mlp\.([^.]+)\.fc1\.weight$")


def state_experts(state: Mapping[str, Any]) -> list[str]:
    """The expert names of a backbone state dict (read off its FFN copies,
    ``...mlp.<expert>.fc1.weight``; BEiT-3's shared ``vl`` expert included), ``[]`` when plain."""
    return sorted({m.group(1) for k in state if (m := _FFN_EXPERT.search(k))})


@dataclass
class Adapted:
    state: dict[str, Any]  # the target's keys that could be filled
    used: set[str]  # source keys that went into it
    needs_expert: bool  # a plain target module met a multiway source module (``expert`` picks the copy)
    copied_shared: bool  # a multiway target module was filled from a shared source module


def adapt_state(state: Mapping[str, Any], target_keys: Iterable[str], target_experts: Sequence[str],
                expert: str | None = None) -> Adapted:
    """Map a backbone state dict onto a backbone whose multiway layout differs.

    A key is split into (key without its expert part, expert or None): ``...mlp.speech.fc1.weight``
    -> (``...mlp.fc1.weight``, ``speech``). For each target key, in order:

    * the same key in ``state``: taken as it is (same layout, or the same expert);
    * a plain module in the target, experts in the source: the copy of ``expert`` (nothing
      is guessed when ``expert`` is None or not among them; ``needs_expert`` says it was asked);
    * experts in the target, a shared module in the source: every expert starts from it.

    Anything else stays unfilled (missing); source keys not in ``used`` are unexpected.
    """
    names = set(state_experts(state)) | set(target_experts) | {"vl"}
    if expert is not None:
        names.add(expert)

    def split(key: str) -> tuple[str, str | None]:
        parts = key.split(".")
        for i in range(1, len(parts) - 1):  # an expert sits between a module and its tensors
            if parts[i] in names:
                return ".".join(parts[:i] + parts[i + 1:]), parts[i]
        return key, None

    by_plain: dict[str, dict[str | None, str]] = {}
    for k in state:
        plain, e = split(k)
        by_plain.setdefault(plain, {})[e] = k
    out: dict[str, Any] = {}
    used: set[str] = set()
    needs_expert = copied_shared = False
    for t in target_keys:
        source = None
        if t in state:
            source = t
        else:
            plain, e = split(t)
            found = by_plain.get(plain, {})
            if e is None and found:
                needs_expert = True
                source = found.get(expert) if expert is not None else None
            elif e is not None and None in found:
                source = found[None]
                copied_shared = True
        if source is not None:
            out[t] = state[source]
            used.add(source)
    return Adapted(out, used, needs_expert, copied_shared)
