"""What glyd::rows checks (glyd.ops._checks): ids outside the table raise as nn.Embedding's do, on
every layout and entry point; damaged offsets and exception indices from a file are refused (never
clamped into wrong rows), checked once a matrix."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import glyd
import glyd.ops as ops
from glyd.errors import CorruptError
from glyd.nn import GlydEmbedding, GlydTiedLinear, set_exact
from glyd.ops.rows import unpack_rows

LAYOUTS = ("fixed12", "tiered", "dense11")
SRC = Path(glyd.__file__).resolve().parents[1]


def _weights(n: int, k: int, seed: int = 0) -> torch.Tensor:
    # spread exponents: escapes in every tier, table digits and exceptions in every layout
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g) * torch.exp2(torch.randn(n, k, generator=g) * 5)).to(torch.bfloat16)


def _entry_points(p: glyd.Packed):
    layout, shape, arrays, version = ops._args(p)
    emb = GlydEmbedding(p)
    model = torch.nn.Sequential(emb, GlydTiedLinear(emb))
    set_exact(model, True)  # exact=True: bf16's own products; the lookup is the same op
    return {
        "unpack_rows": lambda ids: unpack_rows(p, ids),
        "glyd.ops.rows": lambda ids: ops.rows(p, ids),
        "torch.ops.glyd.rows": lambda ids: torch.ops.glyd.rows(layout, shape, arrays, version, ids),
        "GlydEmbedding": emb,
        "exact model": model,
    }


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("ids", [[-1], [-10], [-11], [10], [0, 11], [[3, -2], [4, 5]], [2**40], [-(2**63)]])
def test_ids_outside_the_table_raise_like_nn_embedding(layout, ids):
    w = _weights(10, 70)
    t = torch.tensor(ids)
    with pytest.raises(IndexError):
        F.embedding(t, w)  # what bf16's nn.Embedding does
    for name, call in _entry_points(glyd.pack(w, layout)).items():
        with pytest.raises(IndexError, match=r"row id -?\d+ is out of range: the packed matrix has 10 rows"):
            call(t)
            pytest.fail(f"{name} returned rows for ids {ids}")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ids_inside_the_table_of_any_integer_dtype(layout):
    w = _weights(10, 70)
    p = glyd.pack(w, layout)
    for dtype in (torch.int64, torch.int32, torch.int16, torch.uint8):
        ids = torch.tensor([[9, 0], [3, 9]], dtype=dtype)
        for name, call in _entry_points(p).items():
            if name != "exact model":
                assert torch.equal(call(ids).view(torch.int16), w[ids.long()].view(torch.int16)), (name, dtype)
    assert unpack_rows(p, torch.zeros(0, 3, dtype=torch.int64)).shape == (0, 3, 70)
    # Whole-number float ids (an integer buffer a checkpoint stored in bf16) are rows; 2.5 is none.
    ids = torch.tensor([[9.0, 0.0], [3.0, 9.0]], dtype=torch.bfloat16)
    assert torch.equal(GlydEmbedding(p)(ids).view(torch.int16), w[ids.long()].view(torch.int16))
    for bad, match in ((torch.tensor([2.5]), "whole numbers"), (torch.tensor([True]), "integer tensor"),
                       (torch.tensor([1 + 0j]), "integer tensor")):
        with pytest.raises(TypeError, match=match):
            GlydEmbedding(p)(bad)  # 2.5 used to be truncated to row 2
    with pytest.raises(IndexError):
        GlydEmbedding(p)(torch.tensor([-1.0]))


def _edits(p: glyd.Packed, rng: random.Random, count: int):
    """Seeded single-value edits of the arrays a file gives the row lookup: offsets, exception indices, bases."""
    names = [a for a in ("esc_off", "esc_base", "exc_idx", "base") if a in p.arrays and p.arrays[a].numel()]
    top = {"esc_off": 65535, "base": 255}
    for _ in range(count):
        a = rng.choice(names)
        arrays = {k: v.clone() for k, v in p.arrays.items()}
        v = arrays[a].view(-1)
        i = rng.randrange(v.numel())
        old = int(v[i])
        new = min(max(old + rng.choice([1, -1, 2, -3, 7, 100, -100, 2**20]), 0), top.get(a, 2**30))
        if new != old:
            v[i] = new
            yield f"{a}[{i}] {old} -> {new}", glyd.Packed(p.layout, p.shape, arrays)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_damaged_arrays_are_refused_or_read_as_the_codec_reads_them(layout):
    # The codec (glyd.unpack, the source of truth) checks these arrays on every unpack: wherever it
    # refuses them the row lookup must too (it used to clamp damaged offsets into wrong rows), and
    # wherever it accepts them the row lookup must give its bits.
    w = _weights(12, 1100, seed=3)  # 13 escape blocks in 2 superblocks
    p = glyd.pack(w, layout)
    ids = torch.tensor([11, 0, 5, 5, 7])
    counts = {"refused": 0, "same": 0, "other bits": 0}
    for what, bad in _edits(p, random.Random(layout), 60):
        try:
            want = glyd.unpack(bad)[ids].view(torch.int16)
        except CorruptError:
            want = None
        try:
            got = unpack_rows(bad, ids).view(torch.int16)
        except CorruptError:
            assert want is None, f"{what}: the codec reads it, the row lookup refuses it"
            counts["refused"] += 1
            continue
        assert want is not None, f"{what}: the codec refuses it, the row lookup returned rows"
        counts["same" if torch.equal(got, want) else "other bits"] += 1
    assert counts["other bits"] == 0 and counts["refused"] >= 20, counts


@pytest.mark.parametrize("layout", LAYOUTS)
def test_offsets_far_outside_are_refused(layout):
    p = glyd.pack(_weights(40, 70, seed=1), layout)
    arrays = {k: v.clone() for k, v in p.arrays.items()}
    if layout == "fixed12":
        assert arrays["exc_idx"].numel()
        arrays["exc_idx"][-1] = 2**30  # far outside the matrix
    else:
        arrays["esc_off"][:] = 65535  # offsets far past the escape data
    bad = glyd.Packed(layout, p.shape, arrays)
    for call in _entry_points(bad).values():
        with pytest.raises(CorruptError):
            call(torch.arange(40))
    with pytest.raises(CorruptError):
        glyd.unpack(bad)


def test_arrays_are_checked_once_a_matrix(monkeypatch):
    from glyd.ops import _checks

    calls = []
    check = _checks._CHECKS["tiered"]
    monkeypatch.setitem(_checks._CHECKS, "tiered", lambda p: (calls.append(p.shape), check(p)))
    emb = GlydEmbedding(glyd.pack(_weights(30, 200), "tiered"))
    ids = torch.tensor([[1, 29, 3]])
    first = emb(ids)
    for _ in range(3):
        assert torch.equal(emb(ids).view(torch.int16), first.view(torch.int16))
    assert len(calls) == 1
    off = emb.weight_glyd_esc_off
    off.copy_(off.clone())  # changed in place (as load_state_dict does): checked again
    emb(ids)
    assert len(calls) == 2
    off[1:] = 65535
    with pytest.raises(CorruptError):
        emb(ids)


def test_the_same_arrays_under_another_format_version_are_checked_again():
    # The once-a-matrix check was keyed on the arrays and the shape, not the format version: after a
    # dense11 version-3 matrix's rows were looked up, a Packed over the very same tensors labelled
    # version 2 or 1 skipped the checks the codec refuses it by (its padding columns hold version 3's
    # words) and looked up other weights, with no error
    from glyd.codec.dense11 import pack_v3

    p = pack_v3(_weights(3, 70))
    ids = torch.tensor([0, 2])
    assert torch.equal(unpack_rows(p, ids).view(torch.int16), glyd.unpack(p)[ids].view(torch.int16))
    for version in (2, 1):
        q = glyd.Packed("dense11", p.shape, p.arrays, version)
        with pytest.raises(CorruptError, match="padding"):
            glyd.unpack(q)
        with pytest.raises(CorruptError, match="padding"):
            unpack_rows(q, ids)
        with pytest.raises(CorruptError, match="padding"):
            ops.rows(q, ids)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cuda_ids_outside_the_table_assert_on_the_device(layout):
    # CUDA: no host sync a lookup; torch._assert_async fails on the device, as torch's own embedding
    # does, which leaves the CUDA context unusable: run in a child process.
    w = _weights(10, 70).cuda()
    p = glyd.pack(w, layout)
    emb = GlydEmbedding(p)
    ids = torch.tensor([[9, 0, 4]], device="cuda")
    assert torch.equal(emb(ids).view(torch.int16), w[ids].view(torch.int16))  # the arrays checked on the GPU
    assert torch.equal(emb(ids.cpu()).view(torch.int16), w[ids].view(torch.int16))
    with pytest.raises(IndexError):
        emb(torch.tensor([10]))  # CPU ids: checked on the host
    code = (f"import torch, glyd; p = glyd.pack(torch.ones(10, 70, dtype=torch.bfloat16, device='cuda'), {layout!r}); "
            "glyd.GlydEmbedding(p)(torch.tensor([-1], device='cuda')); torch.cuda.synchronize(); print('no error')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode != 0 and "no error" not in r.stdout and "device-side assert" in r.stderr, r.stderr[-2000:]
