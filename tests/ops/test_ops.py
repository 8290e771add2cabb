"""glyd.ops: dispatch (kernel on CUDA, twin elsewhere), pack/unpack on any device, choose_layout."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import glyd
import glyd.ops as ops

from .conftest import random_weights


def test_import_does_not_import_triton():
    code = "import sys, glyd, glyd.ops, glyd.kernels; assert 'triton' not in sys.modules, 'triton imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("layout", ["fixed12", "tiered"])
def test_cpu_twin(layout):
    # the twin is bf16's own product: F.linear on the unpacked weight, bit for bit
    from glyd.ops.backends import torch as twin

    w = random_weights(12, 100, "normal")
    p = glyd.pack(w, layout)
    assert torch.equal(ops.unpack(p).view(torch.int16), w.view(torch.int16))
    x = torch.randn(3, 5, 100).to(torch.bfloat16)
    b = torch.randn(12).to(torch.bfloat16)
    args = ops._args(p)
    assert torch.equal(twin.unpack(*args).view(torch.int16), w.view(torch.int16))
    assert torch.equal(twin.linear(x, args[0], args[1], args[2], b, args[3]).view(torch.int16),
                       F.linear(x, w, b).view(torch.int16))
    y = ops.linear(x, p, b)  # the CPU's C kernels for fixed12 (other sums, same weights)
    ref = F.linear(x.double(), w.double(), b.double())
    assert ((y.double() - ref).norm() / ref.norm()).item() < 8e-3


def test_choose_layout_defaults_and_table():
    assert ops.choose_layout((4096, 4096), "cpu") == "fixed12"
    assert glyd.pack(random_weights(4, 64, "normal"), "auto").layout == "fixed12"
    shapes = {"4096x4096": {"fixed12": 10.0, "tiered": 10.2}, "512x4096": {"fixed12": 5.0, "tiered": 7.0}}
    assert ops._pick(shapes, (4000, 4000)) == "tiered"  # within the slack: the smaller layout
    assert ops._pick(shapes, (600, 4096)) == "fixed12"
    with pytest.raises(ValueError, match="unknown layout"):
        glyd.pack(random_weights(4, 64, "normal"), "zip")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("layout", ["fixed12", "tiered", "auto"])
def test_gpu_dispatch(layout):
    w = random_weights(300, 1000, "normal", "cuda")
    p = glyd.pack(w, layout)
    assert p.device.type == "cuda"
    assert torch.equal(ops.unpack(p).view(torch.int16), w.view(torch.int16))
    x = torch.randn(2, 1000, device="cuda").to(torch.bfloat16)
    y = ops.linear(x, p)
    ref = F.linear(x.double(), w.double())
    assert ((y.double() - ref).norm() / ref.norm()).item() < 5e-3


def test_cli_bench_registered_and_checks_input():
    from glyd.cli import main

    if torch.cuda.is_available():
        pytest.skip("the error path is for machines without CUDA")
    assert main(["bench", "--shape", "64x64", "--m", "1"]) == 1  # GlydError: needs a CUDA GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cli_bench_runs_gpu(capsys):
    from glyd.cli import main

    assert main(["bench", "--shape", "512x1024", "--m", "1,3", "--copies", "2", "--replays", "3"]) == 0
    assert "512x1024" in capsys.readouterr().out
