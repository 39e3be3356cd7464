"""Plain helpers several test files import (``from support import ...``): pytest puts this
folder on ``sys.path`` because ``tests/conftest.py`` lives here outside a package."""
from __future__ import annotations

import torch
from torch import nn


def perturb_layernorms(model: nn.Module, seed: int = 1, tokens: bool = False) -> None:
    """LayerNorm weights away from 1 and biases away from 0 (and, with ``tokens``, the
    zero-initialised class / mask tokens random), so that a weight mapping is really tested."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g))
        if tokens:
            for name, p in model.named_parameters():
                if name.endswith(("cls_token", "mask_token")):
                    p.copy_(torch.randn(p.shape, generator=g))
