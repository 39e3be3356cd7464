"""Processes and devices: plain ``torch.distributed``, as torchrun sets it up.

``torchrun --nproc_per_node 8 --no-python foundation train CONFIG`` sets RANK / WORLD_SIZE /
LOCAL_RANK / MASTER_ADDR / MASTER_PORT; ``setup`` joins the process group (NCCL on
CUDA, gloo on CPU). A caller that already initialised the group (a test spawning
processes) keeps it. ``wrap`` applies DDP or FSDP2's ``fully_shard``.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from foundation.config import ConfigError


@dataclass
class Env:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    owns_group: bool  # setup() created the process group, teardown() ends it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def setup(device: str = "auto") -> Env:
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("field 'device': 'cuda' asked for, but no CUDA device is available")
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    owns = False
    if not dist.is_initialized() and int(os.environ.get("WORLD_SIZE", 1)) > 1:
        dist.init_process_group("nccl" if use_cuda else "gloo")
        owns = True
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if use_cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    return Env(rank, world, local_rank, dev, owns)


def teardown(env: Env) -> None:
    if env.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: nn.Module, env: Env, strategy: str, find_unused: bool) -> nn.Module:
    """The module the training step calls: ``model`` itself on one process, else DDP
    around it or ``model`` sharded in place by FSDP2 (one unit per block, then the rest)."""
    if not env.distributed:
        return model
    if strategy == "ddp":
        ids = [env.device.index] if env.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids, find_unused_parameters=find_unused)
    return shard(model)


def shard(model: nn.Module) -> nn.Module:
    """FSDP2 in place over the current process group: one unit per block of
    ``model.backbone``'s stacks (each block's parameters gathered only while it runs), then
    the rest of the model."""
    from torch.distributed.fsdp import fully_shard

    for stack in (model.backbone.encoder, model.backbone.decoder):
        if stack is not None:
            for layer in stack.layers:
                fully_shard(layer)
    fully_shard(model)
    return model


def is_fsdp(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def grad_sync(model: nn.Module, sync: bool) -> Iterator[None]:
    """Skip the gradient all-reduce on all but the last backward of an optimizer step."""
    if sync or not dist.is_initialized():
        yield
    elif isinstance(model, nn.parallel.DistributedDataParallel):
        with model.no_sync():
            yield
    elif is_fsdp(model):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


@contextlib.contextmanager
def unsharded(model: nn.Module) -> Iterator[None]:
    """Every parameter whole for the block (FSDP2), e.g. for evaluation code that calls
    head methods other than ``forward``; a no-op otherwise."""
    units = [m for m in model.modules() if is_fsdp(m)] if dist.is_initialized() else []
    for m in units:
        m.unshard()
    try:
        yield
    finally:
        for m in units:
            m.reshard()


def all_reduce(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        if op == "mean":
            t /= dist.get_world_size()
    return t


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def broadcast_flag(flag: bool, env: Env) -> bool:
    """Rank 0's decision, everywhere."""
    if not env.distributed:
        return flag
    t = torch.tensor([int(flag)], device=env.device)
    dist.broadcast(t, 0)
    return bool(t.item())


@contextlib.contextmanager
def deterministic(on: bool):
    """``train.deterministic``: deterministic kernels for the run (a kernel without a
    deterministic version warns and runs), the previous setting back afterwards. cuBLAS needs
    its workspace setting before its first use in the process; set here unless given."""
    if not on:
        yield
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.benchmark)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.benchmark = before[2]
