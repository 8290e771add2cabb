import os

import pytest
import torch

# Without a GPU, Triton kernels run through its interpreter. This must be set before any module
# defines a @triton.jit function: a kernel defined before it is a compiled-mode kernel for good,
# and an interpreted kernel cannot call it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
