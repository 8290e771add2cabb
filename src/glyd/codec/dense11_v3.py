"""``dense11`` format version 3: version 2's arrays (``glyd.codec.dense11_v2``) with ``code`` and ``sm``
permuted inside each row's 1024-column block, so that a GPU warp reading W consecutive runs of a row
reads whole 32-byte sectors (issue 35). Nothing else changes: the same arrays, dtypes and shapes, the
same escape stream, offsets and exception list (a block's first rank still comes from its offsets),
so the size is version 2's to the byte.

For a block of ``RB`` runs of 32 weights (32, or fewer in a row's last, partial block: 16 at K =
3584 and 18944):

- ``code``: the block's 3 RB words are its runs' ``c0`` words (runs 0 .. RB-1), then their ``c1``
  words, then their ``c2`` words (version 2 keeps a run's three words together);
- ``sm``: its 32 RB bytes are its runs' first 16-byte halves (columns 0-15 of runs 0 .. RB-1), then
  their second halves (columns 16-31).

Why block-wise: a kernel step of any width dividing 1024 then reads W consecutive words of each plane
and W consecutive 16-byte halves of each row, whatever its tile (a file cannot know the kernel's).
The H200 probe of 2026-12-05 (``benchmarks/history/2026-12-05-dense11-coalesce-cpu.md``) measured the
GEMV on this order at M = 1 within 1.02-1.05x of bf16 on the 7B's gate_up and down, where version 2's
order was at 1.18-1.25x.

Every function here is torch on the arrays' device (the codec on the CPU, the GPU pack on CUDA).

>>> import torch, glyd
>>> from glyd.codec import dense11, dense11_v3 as V3
>>> p = dense11.pack_v2(torch.randn(3, 2100).to(torch.bfloat16))
>>> c, s = V3.relayout(p.arrays["code"], p.arrays["sm"])
>>> all(torch.equal(a, b) for a, b in zip(V3.restore(c, s), (p.arrays["code"], p.arrays["sm"])))
True
"""

from __future__ import annotations

import functools

import torch

from glyd.errors import FormatError

#: Columns of a block (``glyd.codec.dense11.BLOCK``) and runs of a whole block.
BLOCK = 1024
RUNS = BLOCK // 32


@functools.lru_cache(maxsize=64)
def _orders(runs: int) -> tuple[torch.Tensor, torch.Tensor]:
    # (code, sm) permutations of one row of `runs` runs: version 3's position p holds version 2's order[p]
    code = torch.arange(3 * runs).view(runs, 3)
    sm = torch.arange(32 * runs).view(runs, 2, 16)
    co, so = [], []
    for r0 in range(0, runs, RUNS):
        r1 = min(r0 + RUNS, runs)
        co.append(code[r0:r1].t().reshape(-1))  # [3, RB]: plane-major
        so.append(sm[r0:r1].permute(1, 0, 2).reshape(-1))  # [2, RB, 16]: half-major
    empty = torch.zeros(0, dtype=torch.int64)  # K = 0: no runs
    return torch.cat([empty, *co]), torch.cat([empty, *so])


@functools.lru_cache(maxsize=64)
def _inverse(runs: int) -> tuple[torch.Tensor, torch.Tensor]:
    # (code, sm): version 2's position q sits at version 3's position inverse[q]
    out = []
    for order in _orders(runs):
        inv = torch.empty_like(order)
        inv[order] = torch.arange(order.numel())
        out.append(inv)
    return out[0], out[1]


@functools.lru_cache(maxsize=64)
def _inverse_on(runs: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    # _inverse on `device`, copied once: a step that looks rows up (an embedding) repeats no host-to-device copy,
    # which a CUDA graph cannot capture (scale.py's dense11 step fell back to eager steps, 2026-12-05)
    return tuple(t.to(device) for t in _inverse(runs))


def _runs(code: torch.Tensor, sm: torch.Tensor | None) -> int:
    if code.dtype != torch.int32 or code.dim() != 2 or code.shape[1] % 3:
        raise FormatError(f"dense11 'code' must be int32 [N, 3 R], got {code.dtype} {tuple(code.shape)}")
    runs = code.shape[1] // 3
    if sm is not None and (sm.dtype != torch.uint8 or tuple(sm.shape) != (code.shape[0], 32 * runs)):
        raise FormatError(f"dense11 'sm' must be uint8 [{code.shape[0]}, {32 * runs}] (the runs of 'code' "
                          f"{tuple(code.shape)}), got {sm.dtype} {tuple(sm.shape)}")
    return runs


def relayout_code(code: torch.Tensor) -> torch.Tensor:
    """Version 2's ``code`` [N, 3R] in version 3's order."""
    return code[:, _orders(_runs(code, None))[0].to(code.device)].contiguous()


def restore_code(code: torch.Tensor) -> torch.Tensor:
    """Version 3's ``code`` [N, 3R] (any rows of it) in version 2's order."""
    return code[:, _inverse_on(_runs(code, None), code.device)[0]].contiguous()


def relayout(code: torch.Tensor, sm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Version 2's ``code`` [N, 3R] and ``sm`` [N, 32R] in version 3's order."""
    co, so = _orders(_runs(code, sm))
    return code[:, co.to(code.device)].contiguous(), sm[:, so.to(sm.device)].contiguous()


def restore(code: torch.Tensor, sm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Version 3's ``code`` and ``sm`` in version 2's order (the inverse of ``relayout``)."""
    co, so = _inverse(_runs(code, sm))
    return code[:, co.to(code.device)].contiguous(), sm[:, so.to(sm.device)].contiguous()


def sm_columns(kp: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """int64 [Kp]: where column c of a row sits in that row of version 3's ``sm`` (Kp = the padded
    columns, a multiple of 64). The GEMV's exception pass computes the same index.

    >>> sm_columns(3584)[[0, 16, 32, 3072, 3088]].tolist()
    [0, 512, 16, 3072, 3328]
    """
    if kp % 64:
        raise ValueError(f"padded columns must be a multiple of 64, got {kp}")
    return _inverse_on(kp // 32, torch.device(device))[1]


def from_v2(arrays: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Version 3's arrays of a version-2 matrix's (a permutation of ``code`` and ``sm``; the rest shared)."""
    out = dict(arrays)
    out["code"], out["sm"] = relayout(arrays["code"], arrays["sm"])
    return out


def to_v2(arrays: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Version 2's arrays of a version-3 matrix's (the inverse of ``from_v2``)."""
    out = dict(arrays)
    out["code"], out["sm"] = restore(arrays["code"], arrays["sm"])
    return out
