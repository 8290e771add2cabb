"""dense11 version 3's unpack on the wgmma tile's decode (``dense11/unpack_wg.py``; Hopper only): its column order
mirrored in torch, its checks, a static check compiled for sm_90 on any machine, its bits on the GPU."""

from __future__ import annotations

import pytest
import torch

import glyd

from .conftest import needs_triton, random_weights
from .test_gluon import _res_usage, _sass, compile_gluon_sm90

pytestmark = needs_triton

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def _uw():
    try:
        from glyd.kernels.dense11 import unpack_wg
    except ImportError as exc:  # a Triton without Gluon's Hopper module
        pytest.skip(f"no Gluon wgmma in this Triton: {exc}")
    return unpack_wg


def test_decoded_words_reach_column_order():
    # the decoded lane words ([c1, c0, q1, q0, j, T, h] of a row, built as the kernel joins them: weight i of lane word
    # (c, q) of half h is column 32 c + 16 h + 4 q + i) permuted by COL_ORDER are the step's columns in order
    uw = _uw()

    def join(a, b):
        return torch.stack([a, b], -1)

    cq = torch.arange(16)
    c, q = cq // 4, cq % 4

    def half(h):
        e = [32 * c + 16 * h + 4 * q + i for i in range(4)]
        return join(join(e[0], e[1]), join(e[2], e[3]))

    cols_w = join(half(0), half(1)).reshape([2] * 7)
    order = [d - 1 for d in uw.COL_ORDER.value[1:]]
    assert torch.equal(cols_w.permute(order).reshape(-1), torch.arange(128))


def test_needs_a_cuda_gpu_and_version_3():
    uw = _uw()
    p = glyd.pack(random_weights(64, 256, "normal"), "dense11")
    with pytest.raises(RuntimeError, match="CUDA"):
        uw.unpack_wg(p)


@pytest.mark.parametrize("direct", [False, True])
def test_the_loop_decodes_and_stores_16_bytes_sm90(direct):
    # the K loop (8 steps of a block): 16-byte stores of the bf16 rows (8 a thread a step: 64 rows x 128 columns on
    # 128 threads), the step's words by global loads, one step's shuffles, and nothing spills; direct: no shared
    # memory and no barrier at all (the convert moves registers only)
    from .test_ws import _loops

    uw = _uw()
    from glyd.kernels.dense11.wgmma_decode import run_layout
    from glyd.kernels.fixed12.wgmma import layouts

    ptrs = {"code_ptr": "*i32", "sm_ptr": "*i32", "esc_ptr": "*i32", "ebase_ptr": "*i32", "eoff_ptr": "*u16",
            "out_ptr": "*bf16"}
    const = dict(WL=layouts(64, 16, 4)[0], RL=run_layout(4), SL=uw.direct_layout(4) if direct else uw.store_layout(4))
    k = compile_gluon_sm90(uw._d11_unpack_wg_kernel, const, ptrs, num_warps=4)
    res = _res_usage(k)
    assert res.get("STACK", 0) == 0 and res.get("LOCAL", 0) == 0, res
    loops = _loops(_sass(k))
    assert len(loops) == 1
    ops = loops[0]
    assert sum(o.startswith("STG.E.128") for o in ops) == 8, [o for o in ops if o.startswith("STG")]
    assert [o.split(".")[0] for o in ops].count("SHFL") == 6
    assert "STL" not in ops and "LDL" not in ops
    if direct:
        assert res.get("SHARED", 0) == 0 and not [o for o in ops if o.startswith(("BAR", "STS", "LDS"))]


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("n,k,kind", [(1000, 3584, "normal"), (70, 1152, "wide"), (4608, 3584, "wide"),
                                      (64, 128, "normal")])
def test_unpack_wg_is_bit_exact_gpu(n, k, kind, direct):
    # ragged N, a short last block (K 1152), many escapes and exceptions ("wide"): the weights bit for bit, into a
    # given out too
    uw = _uw()
    torch.manual_seed(n + k)
    w = random_weights(n, k, kind, "cuda")
    p = glyd.pack(w, "dense11")
    assert p.version == 3
    got = uw.unpack_wg(p, direct=direct)
    assert torch.equal(got.view(torch.int16), w.view(torch.int16))
    out = torch.full_like(w, float("nan"))
    assert uw.unpack_wg(p, out, direct) is out and torch.equal(out.view(torch.int16), w.view(torch.int16))
    with pytest.raises(ValueError, match="out must be"):
        uw.unpack_wg(p, out[:, :-1])


def test_long_config_names_its_unpack():
    from glyd.kernels import Dense11LongConfig

    assert Dense11LongConfig().unpack == "triton"
    with pytest.raises(ValueError, match="unpack must be one of triton, wg, wg_direct"):
        Dense11LongConfig(unpack="cuda")


@pytest.mark.parametrize("unpack", ["wg", "wg_direct"])
@pytest.mark.parametrize("version, k, kp, features, why", [
    (3, 3584, 3584, frozenset(), "Hopper"), (2, 3584, 3584, frozenset({"wgmma"}), "version 3"),
    (3, 1100, 1120, frozenset({"wgmma"}), "multiple of 128"), (3, 3584, 3584, frozenset({"wgmma"}), "")])
def test_long_kernel_runs_unpack_wg_only_where_it_can(version, k, kp, features, why, unpack):
    from glyd.kernels import Dense11LongConfig
    from glyd.kernels import registry as R
    from glyd.kernels.dense11.unpack_cublas import Dense11LongKernel

    dev = R.Device("cuda", "test GPU", (9, 0), 132, False, features)
    prob = R.Problem("dense11", 512, 4608, k, kp, version)
    ok, got = Dense11LongKernel.can_implement(prob, dev, Dense11LongConfig(unpack=unpack))
    assert ok == (why == "") and why in got
    assert Dense11LongKernel.can_implement(prob, dev, Dense11LongConfig()) == (True, "")


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("m,n,k,kind", [(192, 1000, 3584, "wide"), (512, 4608, 1152, "normal"), (1, 64, 128, "wide")])
def test_long_kernel_with_unpack_wg_gives_the_triton_unpacks_bits_gpu(m, n, k, kind):
    # the same bf16 matrix in the scratch buffer, the same cuBLAS call: the products' bits equal, bias too
    from glyd import kernels
    from glyd.kernels import Dense11LongConfig

    _uw()
    torch.manual_seed(m + n + k)
    w = random_weights(n, k, kind, "cuda")
    p = glyd.pack(w, "dense11")
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    for b in (None, bias):
        want = kernels.linear(x, p, b, Dense11LongConfig())
        for unpack in ("wg", "wg_direct"):
            got = kernels.linear(x, p, b, Dense11LongConfig(unpack=unpack))
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), unpack
