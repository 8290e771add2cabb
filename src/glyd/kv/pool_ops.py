"""The static pool's ops as ``torch.library`` ops: ``glyd::kvf12_write`` (one side), ``glyd::kvf12_write_pair``
(a layer's keys and values, one kernel on CUDA) and ``glyd::kvf12_attention``.

Their default implementation is the pure-torch twin (``glyd.kv.pool_twin``: the CPU, the tests);
CUDA tensors take the kernel ``glyd.kv.registry`` chooses from the GPU's table (the Triton kernels,
or the twin where none can run). Each op has a fake implementation, so ``torch.compile`` traces a
decode step through both as opaque calls with static shapes.

>>> import torch
>>> from glyd.kv.pool import FixedPagePool
>>> pool = FixedPagePool(layers=1, batch=1, heads=1, head_dim=32, max_len=64, page=32)
>>> x = torch.randn(1, 1, 3, 32).to(torch.bfloat16)
>>> pool.advance(3)
>>> torch.ops.glyd.kvf12_write(x, pool.lens, pool.block_index, *pool.k.layer(0)[:5], pool.k.used[0], pool.k.raw[0])
>>> int(pool.k.raw[0][0, 0, 2, 5].view(torch.int16)) == int(x[0, 0, 2, 5].view(torch.int16))
True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glyd.kernels.registry import Device
from glyd.kv import pool_twin
from glyd.kv.registry import KVKernel, KVProblem, choose

__all__ = ["write", "write_pair", "attention", "refuse", "Kvf12AttentionTorch", "Kvf12WriteTorch", "TwinConfig"]

_T = torch.Tensor


@dataclass(frozen=True)
class TwinConfig:
    """The twins vary nothing."""


class Kvf12AttentionTorch(KVKernel):
    """The twin of the kvf12 decode attention (``glyd.kv.pool_twin.attention_torch``): every device."""

    name = "kvf12_attention_torch"
    code = "kvf12"
    op = "attention"
    Config = TwinConfig

    @classmethod
    def launch(cls, q, lens, starts, block_index, k_side, v_side, scale, *, config, capped=True, num_splits=None,
               valid=None):
        return pool_twin.attention_torch(q, lens, starts, block_index, k_side, v_side, scale, capped=capped,
                                         valid=valid)


class Kvf12WriteTorch(KVKernel):
    """The twin of the pool's page writer (``glyd.kv.pool_twin.write_torch``): every device."""

    name = "kvf12_write_torch"
    code = "kvf12"
    op = "write"
    Config = TwinConfig

    @classmethod
    def launch(cls, x, lens, block_index, lo, code, base, meta, exc, used, raw, *, config):
        pool_twin.write_torch(x, lens, block_index, lo, code, base, meta, exc, used, raw)

    @classmethod
    def launch_pair(cls, keys, values, lens, block_index, k_planes, v_planes, *, config):
        pool_twin.write_torch(keys, lens, block_index, *k_planes)
        pool_twin.write_torch(values, lens, block_index, *v_planes)


def _problem(op: str, page: int, d: int, dv: int, group: int, batch: int = 0) -> KVProblem:
    return KVProblem("kvf12", op, page, d, dv, group, "pool", batch)


@torch.library.custom_op("glyd::kvf12_write", mutates_args=("lo", "code", "base", "meta", "exc", "used", "raw"))
def _write(x: _T, lens: _T, block_index: _T, lo: _T, code: _T, base: _T, meta: _T, exc: _T, used: _T,
           raw: _T) -> None:
    pool_twin.write_torch(x, lens, block_index, lo, code, base, meta, exc, used, raw)


@_write.register_kernel("cuda")
def _write_cuda(x, lens, block_index, lo, code, base, meta, exc, used, raw) -> None:
    kc, cfg = choose(_problem("write", lo.shape[1], x.shape[3], x.shape[3], 1), Device.of(x.device))
    kc.launch(x, lens, block_index, lo, code, base, meta, exc, used, raw, config=cfg)


@_write.register_fake
def _write_fake(x, lens, block_index, lo, code, base, meta, exc, used, raw) -> None:
    return None


_PAIR = ("klo", "kcode", "kbase", "kmeta", "kexc", "kused", "kraw", "vlo", "vcode", "vbase", "vmeta", "vexc", "vused", "vraw")


@torch.library.custom_op("glyd::kvf12_write_pair", mutates_args=_PAIR)
def _write_pair(keys: _T, values: _T, lens: _T, block_index: _T, klo: _T, kcode: _T, kbase: _T, kmeta: _T, kexc: _T,
                kused: _T, kraw: _T, vlo: _T, vcode: _T, vbase: _T, vmeta: _T, vexc: _T, vused: _T, vraw: _T) -> None:
    pool_twin.write_torch(keys, lens, block_index, klo, kcode, kbase, kmeta, kexc, kused, kraw)
    pool_twin.write_torch(values, lens, block_index, vlo, vcode, vbase, vmeta, vexc, vused, vraw)


@_write_pair.register_kernel("cuda")
def _write_pair_cuda(keys, values, lens, block_index, klo, kcode, kbase, kmeta, kexc, kused, kraw, vlo, vcode, vbase,
                     vmeta, vexc, vused, vraw) -> None:
    kc, cfg = choose(_problem("write", klo.shape[1], keys.shape[3], keys.shape[3], 1), Device.of(keys.device))
    kc.launch_pair(keys, values, lens, block_index, (klo, kcode, kbase, kmeta, kexc, kused, kraw),
                   (vlo, vcode, vbase, vmeta, vexc, vused, vraw), config=cfg)


@_write_pair.register_fake
def _write_pair_fake(keys, values, lens, block_index, klo, kcode, kbase, kmeta, kexc, kused, kraw, vlo, vcode, vbase,
                     vmeta, vexc, vused, vraw) -> None:
    return None


@torch.library.custom_op("glyd::kvf12_attention", mutates_args=())
def _attention(q: _T, lens: _T, starts: _T | None, block_index: _T, k_side: list[_T], v_side: list[_T],
               scale: float, valid: _T | None = None) -> _T:
    return pool_twin.attention_torch(q, lens, starts, block_index, k_side, v_side, scale, valid=valid)


@_attention.register_kernel("cuda")
def _attention_cuda(q, lens, starts, block_index, k_side, v_side, scale, valid=None):
    problem = _problem("attention", k_side[0].shape[1], q.shape[2], v_side[0].shape[2], q.shape[1] // block_index.shape[1],
                       q.shape[0])  # the table's launch may depend on the sequences (programs an SM)
    kc, cfg = choose(problem, Device.of(q.device))
    return kc.launch(q, lens, starts, block_index, k_side, v_side, scale, config=cfg, valid=valid)


@_attention.register_fake
def _attention_fake(q, lens, starts, block_index, k_side, v_side, scale, valid=None):
    return q.new_empty((q.shape[0], q.shape[1], v_side[0].shape[2]))


# cudagraph_unsafe: a graph that refuses runs without CUDA graphs (it raises on every call, none is recorded);
# looked up, not assumed: the tag's presence in every torch this project allows is unchecked here
_UNSAFE = tuple(t for t in (getattr(torch.Tag, "cudagraph_unsafe", None),) if t is not None)


@torch.library.custom_op("glyd::kv_refuse", mutates_args=("lens",), tags=_UNSAFE)
def _refuse(lens: _T, message: str) -> None:
    raise pool_twin.KVCapacityError(message)


@_refuse.register_fake
def _refuse_fake(lens, message) -> None:
    return None


# x [B, H, T, D] bf16; lens [B] int32 (tokens after the write); block_index [B, H, J] int32; lo/code/base/meta
# [NB, ...]; exc [E + 1] int32; used [1] int32; raw [B, H, P, D] bf16 (see glyd.kv.pool_twin).
def write(x, lens, block_index, lo, code, base, meta, exc, used, raw) -> None:
    """``torch.ops.glyd.kvf12_write``: write ``x`` into a pool side (one kernel)."""
    torch.ops.glyd.kvf12_write(x, lens, block_index, lo, code, base, meta, exc, used, raw)


# keys, values [B, H, T, D] bf16 (one head dim); lens, block_index as write; k_planes, v_planes: each side's
# (lo, code, base, meta, exc, used, raw)
def write_pair(keys, values, lens, block_index, k_planes, v_planes) -> None:
    """``torch.ops.glyd.kvf12_write_pair``: write a layer's keys and values (one kernel for both sides on CUDA)."""
    torch.ops.glyd.kvf12_write_pair(keys, values, lens, block_index, *k_planes, *v_planes)


# lens [B] int32 (declared mutated, never changed: the op stays in a compiled graph, ordered before lens's updates)
def refuse(lens, message: str) -> None:
    """``torch.ops.glyd.kv_refuse``: raise ``KVCapacityError(message)`` when it runs. A compiled prompt's
    capacity refusal (``FixedPagePool._refused``): the check is decided while tracing, the raise happens
    when the compiled code runs, with no graph break."""
    torch.ops.glyd.kv_refuse(lens, message)


# q [B, Hq, D] bf16; lens [B] int32; starts [B] int32 or None; block_index [B, H, J] int32;
# k_side/v_side [lo, code, base, meta, exc, raw]; valid [B, S] bool/uint8 or None -> [B, Hq, DV] bf16.
def attention(q, lens, starts, block_index, k_side, v_side, scale: float, valid=None) -> torch.Tensor:
    """``torch.ops.glyd.kvf12_attention``: decode attention over a pool's layer (one kernel and a combine).
    ``valid [B, S]``: position ``t`` of sequence ``b`` is attended only where ``t < S`` and ``valid[b, t]``."""
    if starts is not None:
        starts = starts.to(device=q.device, dtype=torch.int32)
    if valid is not None:
        valid = valid.to(device=q.device)
    return torch.ops.glyd.kvf12_attention(q, lens, starts, block_index, list(k_side), list(v_side), float(scale),
                                          valid)
