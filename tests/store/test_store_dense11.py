"""A dense11 matrix through the packed checkpoint format: written, reopened, verified, unpacked bit for bit."""

import torch

import glyd
from glyd.store import CheckpointReader, CheckpointWriter, sha256_tensor


def test_dense11_checkpoint_round_trip(tmp_path):
    g = torch.Generator().manual_seed(0)
    mats = {
        "a.weight": (torch.randn(33, 1100, generator=g) * torch.logspace(-5, 3, 1100)).to(torch.bfloat16),
        "b.weight": (torch.randn(7, 70, generator=g) * 0.02).to(torch.bfloat16),
    }
    with CheckpointWriter(tmp_path / "out", layout="dense11") as ckpt:
        for name, w in mats.items():
            ckpt.add_packed(name, glyd.pack(w, "dense11"), sha256_tensor(w))
        ckpt.add_tensor("scale", torch.tensor([1.5]))
        ckpt.set_config({"model_type": "demo"})
    r = CheckpointReader(tmp_path / "out")
    assert r.layout == "dense11"
    assert r.verify(progress=False)["packed"] == 2
    for name, w in mats.items():
        p = r.get(name)
        assert p.layout == "dense11" and set(p.arrays) == set(glyd.LAYOUTS["dense11"].arrays)
        assert torch.equal(glyd.unpack(p).view(torch.int16), w.view(torch.int16))
        assert r.entry(name)["arrays"]["exc_idx"]["dtype"] == "int32"
