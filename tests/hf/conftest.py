"""Shared fixtures: tiny bf16 causal LMs (Llama, Qwen2, Mistral, Gemma) built from configs with
random weights and saved as transformers folders (safetensors), once a test session.

``tiny_model_folder(family)`` returns the folder path; ``TINY_FAMILIES`` lists the families. The
weights are normal with std 0.02 (a realistic bf16 exponent spread), norms around 1.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tiny_models import TINY_FAMILIES, VOCAB, build_tiny_model, tiny_config  # noqa: E402,F401


@pytest.fixture(scope="session")
def tiny_model_folder(tmp_path_factory):
    """``tiny_model_folder(family, **config_overrides)`` -> Path of a saved bf16 tiny model (cached)."""
    cache: dict = {}

    def make(family: str = "llama", **overrides) -> Path:
        key = (family, tuple(sorted(overrides.items())))
        if key not in cache:
            dst = tmp_path_factory.mktemp(f"tiny-{family}") / "model"
            cache[key] = build_tiny_model(family, dst, **overrides)
        return cache[key]

    return make


@pytest.fixture
def input_ids():
    g = torch.Generator().manual_seed(1)
    return torch.randint(3, VOCAB, (2, 12), generator=g)


@pytest.fixture
def module_budget():
    """The transformers model modules built while the test runs (a list of class names); fails
    (instead of running out of memory) past 5,000: before the counts were checked, a config claiming
    10^30 layers built layers until memory ran out."""
    built: list[str] = []

    def hook(module, name, sub):
        if type(sub).__module__.startswith("transformers.models."):
            built.append(type(sub).__name__)
            if len(built) > 5000:
                raise RuntimeError("more than 5,000 modules built")

    handle = torch.nn.modules.module.register_module_module_registration_hook(hook)
    yield built
    handle.remove()
