"""The models ``glyd eval`` compares: random-weight models from a config, and bf16 with merged products."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from glyd.errors import FormatError, show_path
from glyd.store import MANIFEST

log = logging.getLogger(__name__)


def check_model_folder(folder: Path) -> None:
    """Refuse what ``glyd eval`` cannot compare: not a model folder, or a folder Glyd already packed
    (its bf16, fixed12 and tiered rows would all be that one packed model)."""
    cfg_path = folder / "config.json"
    if not folder.exists():
        raise FormatError(f"model {show_path(folder)}: no such folder; glyd eval takes a bf16 transformers folder, a "
                          "hub id, smollm2 (the demo's model), or --random with a known name or a config.json")
    if not folder.is_dir() or not cfg_path.is_file():
        raise FormatError(f"model {show_path(folder)}: not a model folder (no config.json); pass a folder, or "
                          "--random with a config")
    from glyd.hf.classes import read_config

    # FormatError for a config.json that is not a JSON object glyd can read: transformers' own errors
    # (OSError, RecursionError, TypeError) escaped glyd eval as tracebacks
    q = read_config(folder).get("quantization_config")
    if (folder / MANIFEST).is_file() or (isinstance(q, dict) and q.get("quant_method") == "glyd"):
        raise FormatError(
            f"{show_path(folder)}: a packed Glyd folder; glyd eval needs the bf16 source model (it packs each mode "
            "itself)"
        )


def check_modes_fit(model: str, layouts: list[str], limit: int) -> None:
    """Each Glyd mode's layout against ``limit`` (``memory_limit``), counted on ``model``'s config as
    the loader counts: refused before bf16's run, not when the mode's turn comes after it."""
    from glyd.apps.fit import load_config
    from glyd.apps.fit_meta import model_shape
    from glyd.hf.memory import WeightsCount, fit_layout, limit_name

    try:
        shape = model_shape(load_config(model))
    except FormatError as exc:  # a config glyd fit cannot build (custom code): each mode's loading checks it
        log.info("%s: %s; each mode is checked as it loads", limit_name(), exc)
        return
    count = WeightsCount(shape.packable, shape.other * 2, shape.packable_rows)
    for layout in dict.fromkeys(layouts):
        fit_layout(count, layout, limit)


def _random_config(spec: str):
    from glyd.apps.fit import KNOWN_CONFIGS, load_config
    from glyd.apps.fit_meta import build_config, meta_model

    cfg = load_config(spec)
    if spec.lower() in KNOWN_CONFIGS:
        cfg.setdefault("initializer_range", 0.02)
    # as glyd fit reads a config: counts bounded before transformers builds a layer for each (10**9
    # layers built until memory ran out), and transformers' errors, in the config class or in the model's
    # constructors (an unknown model_type, a negative width, 0 heads), one FormatError line
    config = build_config(cfg)
    meta_model(config, str(cfg.get("_name", spec)))
    return config


def build_random(spec: str, device: str, seed: int, *, layout: str | None = None, exact: bool = False,
                 merge: bool | None = None, progress: bool = False, memory_limit: int | None = None) -> nn.Module:
    """A causal LM with random weights from a config (same ``seed`` and device: same weights), made a
    tensor at a time on ``device`` (``glyd.hf.synthetic``): packed as ``layout`` as each weight is
    made, or plain bf16 (``layout=None``). The whole bf16 model is never held, on the host or the GPU."""
    from glyd.hf.synthetic import random_model

    return random_model(_random_config(spec), layout=layout, device=device, merge=merge, exact=exact, seed=seed,
                        progress=progress, memory_limit=memory_limit)


#: the names transformers gives a learned (absolute) position table: GPT-2's ``wpe``, BERT-likes'
#: ``position_embeddings``, OPT's ``embed_positions`` (with an offset of 2 rows)
POSITION_TABLES = ("wpe", "position_embeddings", "embed_positions")


def check_positions(model: nn.Module, needed: int, what: str) -> None:
    """FormatError when ``model`` has a learned position table of fewer than ``needed`` positions:
    position ``needed - 1`` would index past it (an IndexError on the CPU, a device-side assert that
    ends the CUDA context on a GPU). Rotary models have no such table and no limit here.

    >>> from torch import nn
    >>> m = nn.Module(); m.wpe = nn.Embedding(16, 4)
    >>> check_positions(m, 16, "a window")
    >>> check_positions(m, 17, "a window")
    Traceback (most recent call last):
    ...
    glyd.errors.FormatError: a window needs 17 positions, but the model's learned position table wpe holds 16: ask for fewer
    """
    for name, mod in model.named_modules():
        rows = getattr(mod, "num_embeddings", None)
        if name.rpartition(".")[2] not in POSITION_TABLES or not isinstance(rows, int):
            continue
        have = rows - int(getattr(mod, "offset", 0) or 0)
        if needed > have:
            raise FormatError(f"{what} needs {needed} positions, but the model's learned position table {name} "
                              f"holds {have}: ask for fewer")


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the parameters and persistent buffers of ``model``; a tensor shared by several
    modules (tied embeddings) is counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for module in model.modules():
        tensors = list(module._parameters.values())
        tensors += [b for n, b in module._buffers.items() if n not in module._non_persistent_buffers_set]
        for t in tensors:
            if t is None:
                continue
            key = (t.data_ptr(), t.nbytes)
            if key in seen:
                continue
            seen.add(key)
            total += t.nbytes
    return total


class _MergedLinear(nn.Module):
    """bf16 q|k|v (or gate|up) as one ``F.linear``; the first part's call runs the product and the
    other parts return their slices of it (the model calls them in order with the same input)."""

    def __init__(self, linears: list[nn.Linear]) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.cat([lin.weight.detach() for lin in linears]), requires_grad=False)
        biases = [lin.bias for lin in linears]
        if any(b is not None for b in biases):
            self.bias = nn.Parameter(
                torch.cat([b.detach() if b is not None else torch.zeros(lin.out_features, dtype=lin.weight.dtype, device=lin.weight.device) for b, lin in zip(biases, linears)]),
                requires_grad=False,
            )
        else:
            self.bias = None
        self.splits = [lin.out_features for lin in linears]
        self._pending: tuple[torch.Tensor, tuple[torch.Tensor, ...]] | None = None

    def part(self, x: torch.Tensor, index: int) -> torch.Tensor:
        if index == 0 or self._pending is None or self._pending[0] is not x:
            self._pending = (x, F.linear(x, self.weight, self.bias).split(self.splits, dim=-1))
        out = self._pending[1][index]
        if index == len(self.splits) - 1:
            self._pending = None
        return out


class _Part(nn.Module):
    def __init__(self, merged: _MergedLinear, index: int) -> None:
        super().__init__()
        self.__dict__["merged"] = merged  # registered once, on the parent
        self.index = index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.merged.part(x, self.index)


_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def merge_bf16(model: nn.Module) -> int:
    """Merge q|k|v and gate|up of a bf16 model into one product each, in place; returns how many.

    Each group's separate weights are freed as soon as it is merged: the peak is the model plus one
    group's merged copy. (Holding the list of every module kept every original alive until the end:
    bf16 Llama-3.1-70B then needed 131.4 + 82.5 GiB and ran out of memory on an H200.)"""
    count = 0
    parents = [m for m in model.modules() if any(hasattr(m, g[0]) for g in _GROUPS)]  # no leaf held
    for module in parents:
        for group in _GROUPS:
            lins = [getattr(module, n, None) for n in group]
            if not all(type(lin) is nn.Linear for lin in lins):
                continue
            if len({lin.in_features for lin in lins}) != 1:
                continue
            merged = _MergedLinear(lins)
            module.add_module("_merged_" + "_".join(n.split("_")[0] for n in group), merged)
            for i, name in enumerate(group):
                setattr(module, name, _Part(merged, i))
            count += 1
    return count
