"""dense11 format version 3 (``glyd.codec.dense11_v3``): version 2's arrays with ``code`` and ``sm``
permuted block-wise. The round trip bit for bit (normal, wide, crowded weights; ragged K, last blocks
of 2, 16 and 32 runs), each value where the order puts it, the same size and other arrays as version
2, the row lookup, hostile arrays refused, and version 3 through ``glyd.store`` beside versions 1, 2."""

import pytest
import torch

import glyd
from glyd.codec import LAYOUTS, dense11
from glyd.codec import dense11_v3 as V3
from glyd.errors import CorruptError, FormatError
from glyd.ops.rows import unpack_rows
from glyd.store import CheckpointReader, CheckpointWriter, sha256_tensor


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def weights(n: int, k: int, seed: int, kind: str = "normal") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    if kind == "wide":  # many escapes, table digits, exceptions
        w = w * torch.exp2(torch.randn(n, k, generator=g) * 3)
    if kind == "crowded":  # runs of 9-32 escapes: ranks 8 and up are exceptions
        for r, c in zip(range(n), (9, 12, 20, 32)):
            w[r, :c] = 3.0 + torch.rand(c, generator=g)
    return w.to(torch.bfloat16)


SHAPES = [(5, 70, "normal"), (6, 1030, "crowded"), (3, 2100, "wide"), (4, 3584, "crowded"), (2, 1, "normal"),
          (7, 2048, "wide"), (0, 100, "normal"), (3, 0, "normal")]


@pytest.mark.parametrize("n,k,kind", SHAPES)
def test_round_trip_and_the_same_arrays_as_v2(n, k, kind):
    w = weights(n, k, n + k, kind)
    p3, p2 = dense11.pack_v3(w), dense11.pack_v2(w)
    assert p3.version == 3 and p3.nbytes == p2.nbytes
    assert torch.equal(bits(glyd.unpack(p3)), bits(w))
    for name in dense11.ARRAYS:  # only code and sm move
        if name not in ("code", "sm"):
            assert torch.equal(p3.arrays[name], p2.arrays[name]), name
    assert torch.equal(V3.restore_code(p3.arrays["code"]), p2.arrays["code"])
    c, s = V3.restore(p3.arrays["code"], p3.arrays["sm"])
    assert torch.equal(c, p2.arrays["code"]) and torch.equal(s, p2.arrays["sm"])
    if n and k > 64:  # several runs of real weights a row: the order did change
        assert not torch.equal(p3.arrays["code"], p2.arrays["code"])
        assert not torch.equal(p3.arrays["sm"], p2.arrays["sm"])
    if n:
        rows = torch.arange(n).flip(0)
        assert torch.equal(bits(unpack_rows(p3, rows)), bits(w[rows]))


@pytest.mark.parametrize("k", [70, 1030, 2100, 3584])
def test_each_value_where_the_order_puts_it(k):
    p2 = dense11.pack_v2(weights(3, k, k, "wide"))
    code, sm = V3.relayout(p2.arrays["code"], p2.arrays["sm"])
    kp = sm.shape[1]
    runs = kp // 32
    cols = V3.sm_columns(kp)
    assert torch.equal(sm[:, cols], p2.arrays["sm"])  # sm_columns: column c's byte in a v3 row
    for j in range(runs):  # run j of block b (rb runs): its c_x at 96 b + x rb + (j - 32 b)
        b = j // 32
        rb = min(runs - 32 * b, 32)
        for x in range(3):
            assert torch.equal(code[:, 96 * b + x * rb + j - 32 * b], p2.arrays["code"][:, 3 * j + x]), (j, x)
    for c in range(kp):  # half h of run j: 16 bytes at 1024 b + 16 h rb + 16 (j - 32 b)
        b, cc = divmod(c, 1024)
        j, t = divmod(cc, 32)
        rb = min(runs - 32 * b, 32)
        assert int(cols[c]) == 1024 * b + (t // 16) * 16 * rb + 16 * j + t % 16


def test_v3_and_v2_read_by_the_layout():
    assert LAYOUTS["dense11"].reads == (1, 2, 3)
    w = weights(3, 70, 1)
    p = dense11.pack_v3(w)
    q = glyd.Packed("dense11", p.shape, dict(p.arrays), 3)
    assert torch.equal(bits(glyd.unpack(q)), bits(w))
    for bad in (4, 0):
        with pytest.raises(FormatError, match="format version"):
            glyd.Packed("dense11", p.shape, dict(p.arrays), bad)


def test_v3_arrays_read_as_v2_are_refused_or_wrong_never_silently_equal():
    # the version decides the order: version 3's arrays under version 2 do not decode to the weights
    w = weights(4, 1030, 5, "wide")
    p = dense11.pack_v3(w)
    try:
        got = glyd.unpack(glyd.Packed("dense11", p.shape, dict(p.arrays), 2))
    except CorruptError:
        return
    assert not torch.equal(bits(got), bits(w))


def _with(p: glyd.Packed, **arrays) -> glyd.Packed:
    return glyd.Packed(p.layout, p.shape, {**p.arrays, **arrays}, p.version)


def test_hostile_v3_arrays_refused():
    w = weights(3, 70, 7, "wide")
    p = dense11.pack_v3(w)
    kp = p.arrays["sm"].shape[1]
    sm = p.arrays["sm"].clone()
    sm[1, int(V3.sm_columns(kp)[100])] = 1  # a padding column's byte, at its version-3 place
    with pytest.raises(CorruptError, match="padding columns"):
        glyd.unpack(_with(p, sm=sm))
    with pytest.raises(CorruptError, match="padding columns"):
        unpack_rows(_with(p, sm=sm), torch.tensor([1]))
    idx = p.arrays["exc_idx"]
    assert idx.numel() > 1
    with pytest.raises(CorruptError):
        glyd.unpack(_with(p, exc_idx=idx[:-1].clone(), exc_exp=p.arrays["exc_exp"][:-1].clone()))
    with pytest.raises(FormatError, match="'code'"):
        V3.restore_code(p.arrays["code"][:, :-1])


def test_v3_checkpoint_round_trip_beside_v1_and_v2(tmp_path):
    w = weights(21, 1100, 9, "wide")
    w2 = weights(5, 70, 10)
    with CheckpointWriter(tmp_path / "out", layout="dense11") as ckpt:
        ckpt.add_packed("a.weight", dense11.pack_v3(w), sha256_tensor(w))
        ckpt.add_packed("b.weight", dense11.pack_v2(w2), sha256_tensor(w2))
        ckpt.add_packed("c.weight", dense11.pack_v1(w2), sha256_tensor(w2))
    r = CheckpointReader(tmp_path / "out")
    assert r.verify(progress=False)["packed"] == 3
    assert [r.entry(f"{x}.weight")["format_version"] for x in "abc"] == [3, 2, 1]
    assert torch.equal(bits(glyd.unpack(r.get("a.weight"))), bits(w))
    for x in "bc":
        assert torch.equal(bits(glyd.unpack(r.get(f"{x}.weight"))), bits(w2))


# Pinned (docs/format.md, "dense11 format version 3"); a change here is a format change.
GOLDEN_V3_CODE_ROW1 = [-53687092, 2004318071, 4473924, 0, -1127428916, 858923554, 0, 0, -17477, -876889157, 0, 0]


def test_golden_bytes_v3():
    from .test_dense11 import tiny
    from .test_dense11_v2 import GOLDEN_V2_CODE_ROW1, GOLDEN_V2_VALUES

    p, p2 = dense11.pack_v3(tiny()), dense11.pack_v2(tiny())
    assert p.version == 3 and glyd.pack(tiny(), "dense11").version == 3
    assert {k: p.arrays[k].tolist() for k in GOLDEN_V2_VALUES} == GOLDEN_V2_VALUES
    assert p2.arrays["code"][1].tolist() == GOLDEN_V2_CODE_ROW1
    assert p.arrays["code"][1].tolist() == GOLDEN_V3_CODE_ROW1
    # sm: one block of 4 runs a row: the runs' first halves, then their second halves
    want = p2.arrays["sm"].view(3, 4, 2, 16).permute(0, 2, 1, 3).reshape(3, 128)
    assert torch.equal(p.arrays["sm"], want)
    assert torch.equal(bits(glyd.unpack(p)), bits(tiny()))
