"""The memory a packed model's weights take, counted before any weight is read, and the layout
chosen for a memory limit (``from_pretrained(..., memory_limit=...)``, ``compress``).

The count is ``glyd fit``'s (``glyd.apps.fit_meta`` uses :func:`count_weights`): the weights the
packer packs (its own predicates: exact ``nn.Linear`` and ``nn.Embedding`` weights, the fused 3-D
weights of MoE experts) at the layout's planning bits a weight (``glyd.LAYOUTS[name].bits``:
fixed12 12.05, dense11 11.25, tiered 10.85) over their columns padded as the layout pads them
(``Layout.padded_cols``: K = 96 is stored as 128), every other parameter (norms, biases, routers)
at 2 bytes (bf16) on an empty model, as it is held on a loaded one (a float32 norm's 4); a tied
weight once. It is the weights' memory only: not the KV cache, not activations.

``layout="auto"`` with a limit takes, for the whole model, the first layout of :data:`SPEED_ORDER`
whose weights fit: the fastest that fits.

>>> from glyd.hf.memory import parse_memory, weights_bytes
>>> parse_memory("40GB"), parse_memory("40GiB") == 40 * 2**30, parse_memory(1024)
(40000000000, True, 1024)
>>> weights_bytes(packable=1000, other_bytes=64, layout="fixed12")  # 1000 x 12.05 / 8 + 64
1570
"""

from __future__ import annotations

import logging
import math
import numbers
import re
from collections import Counter
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any, Collection, Iterator

from torch import nn

from glyd.codec import LAYOUTS
from glyd.errors import GlydError, show_path
from glyd.hf._model import is_packable_embedding, is_packable_linear, kept_unpacked, packed_ties
from glyd.nn.experts import is_packable as packable_experts
from glyd.store._safetensors import read_header

log = logging.getLogger(__name__)

__all__ = ["SPEED_ORDER", "WeightsCount", "count_weights", "packable_rows", "parse_memory", "read_size", "weights_bytes", "fit_layout",
           "check_packed", "check_stored", "limit_name", "limit_named"]

#: Layouts from the fastest to the slowest, as their decode was measured on the H200 at M = 1
#: (Qwen2.5-7B shape; benchmarks/RESULTS.md, issue 35): the step's linears take 0.86x bf16's time in
#: fixed12, 4.80x in dense11 (dense11_step.py, 2026-12-03) and 8.59x in tiered (run 97). Smaller
#: is slower, so the first that fits is the fastest that fits.
SPEED_ORDER = ("fixed12", "dense11", "tiered")
#: The largest limit taken (1 EiB): a bound, not a machine.
MAX_BYTES = 2**60
_BF16 = 2
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]i?b|b)?\s*$", re.IGNORECASE)
_SCALE = {"b": 0, "k": 1, "m": 2, "g": 3, "t": 4}
#: What the limit's messages call it: the Python argument, or the option of the command that set it
#: (:func:`limit_named`); a context variable, so another thread or task keeps its own.
_LIMIT_NAME: ContextVar[str] = ContextVar("glyd_memory_limit_name", default="memory_limit")


def limit_name() -> str:
    """What the limit's messages call it here (:func:`limit_named`)."""
    return _LIMIT_NAME.get()


@contextmanager
def limit_named(name: str) -> Iterator[None]:
    """Inside it, the limit's messages name it ``name`` (a command's ``"--memory-limit"``).

    >>> with limit_named("--memory-limit"):
    ...     fit_layout(WeightsCount(packable=8 * 2**30, other_bytes=0), "fixed12", 2**30)
    Traceback (most recent call last):
    glyd.errors.GlydError: layout fixed12: its weights need 12.05 GiB, --memory-limit allows 1.00 GiB (nothing was packed)
    """
    token = _LIMIT_NAME.set(name)
    try:
        yield
    finally:
        _LIMIT_NAME.reset(token)


def read_size(text: str, bare: str | None = "gib") -> int | None:
    """``text`` (``"40GB"`` = 40 x 10^9 bytes, ``"40GiB"`` = 40 x 2^30, ``"512MiB"``, ``"1000B"``, ...) in bytes;
    a number without a unit is read as ``bare`` (None: not a size). None when ``text`` is no size
    (the caller says what it wanted); ``glyd fit --gpu`` reads its sizes with it too.

    >>> read_size("1.5 KiB"), read_size("2"), read_size("2", bare=None), read_size("lots")
    (1536, 2147483648, None, None)
    """
    m = _SIZE.match(str(text))
    if not m or (m.group(2) is None and bare is None):
        return None
    unit = (m.group(2) or bare).lower()
    power = _SCALE[unit[0]]
    scale = 1024**power if unit.endswith("ib") else 1000**power
    with localcontext() as ctx:  # exact (a float of 400 digits is inf), and past int(str)'s 4300 digits
        ctx.prec = len(m.group(1)) + 20
        return int(Decimal(m.group(1)) * scale)


def parse_memory(value: Any, what: str | None = None) -> int:
    """A memory limit in bytes: an int (bytes) or a string with its unit (``"40GB"``, ``"40GiB"``);
    ``what`` names it in errors (``"--memory-limit"``: a command's option, which takes strings only;
    default: the name :func:`limit_named` set, ``memory_limit`` outside it)."""
    what = _LIMIT_NAME.get() if what is None else what
    option = what.startswith("--")
    shown = str(value) if len(str(value)) <= 40 else str(value)[:37] + "..."
    quoted = isinstance(value, str) and not option or not shown.isprintable()  # a line break: escaped, one line
    label = f"{what}{' ' if option else '='}{shown!r}" if quoted else f"{what}{' ' if option else '='}{shown}"
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, str)):
        raise GlydError(f"{label}: give bytes (an int) or a size with its unit, e.g. '40GB' or '40GiB'")
    size = int(value) if isinstance(value, numbers.Integral) else read_size(value, bare=None)  # numpy's ints too
    if size is None:
        raise GlydError(f"{label}: give a size with its unit, e.g. 40GB (40 x 10^9 bytes), 40GiB (40 x 2^30) or "
                        f"512MiB{'' if option else ', or an int of bytes'}")
    if size <= 0:
        raise GlydError(f"{label}: must be positive")
    if size > MAX_BYTES:
        raise GlydError(f"{label}: more than any machine holds (at most 2^60 bytes)")
    return size


def _packable(model: nn.Module) -> set[int]:
    """The ids of the parameters the packer packs (its own predicates)."""
    ids = set()
    kept = kept_unpacked(model)  # run in float32 by the model: not packed
    for name, m in model.named_modules():
        if (is_packable_linear(m) or is_packable_embedding(m)) and name not in kept:
            ids.add(id(m.weight))
        ids.update(id(m._parameters[n]) for n in packable_experts(m))
    return ids


def _tied_copies(model: nn.Module, stored: Collection[str] | None = None) -> tuple[set[int], list[nn.Parameter]]:
    """(the ids of the weights the packer does not keep apart, the copies it packs apart all the same).

    Not kept apart (``packed_ties``): a weight tied to its source by the config and not yet sharing
    it (an empty model, built without the ties), or equal to it. Packed apart: a tied copy that
    ``stored`` (the checkpoint's tensor names) holds besides the first of its group, as the loader
    packs it when its values differ (T5 v1.1's lm_head; an equal copy is shared: then an upper bound).
    """
    import torch

    drop: set[int] = set()
    apart: list[nn.Parameter] = []
    for members in packed_ties(model):
        ws = {m: getattr(model.get_submodule(m), "weight", None) for m in members}
        ws = {m: w for m, w in ws.items() if isinstance(w, nn.Parameter)}
        if not ws:
            continue
        first = next(iter(ws.values()))
        for w in list(ws.values())[1:]:
            if w is not first and (w.is_meta or first.is_meta or
                                   (w.shape == first.shape and torch.equal(w, first))):
                drop.add(id(w))
        kept = [m for m in ws if f"{m}.weight" in (stored or ())]
        apart += [ws[m] for m in kept[1:] if ws[m] is first or id(ws[m]) in drop]
    return drop, apart


def _weights_of(model: nn.Module, stored: Collection[str] | None = None) -> list[nn.Parameter]:
    """The parameters the packed model holds: each once, a tied copy not at all unless ``stored`` holds it."""
    dropped, apart = _tied_copies(model, stored)
    return [p for p in model.parameters() if id(p) not in dropped] + apart


def count_weights(model: nn.Module, stored: Collection[str] | None = None) -> tuple[int, int, Counter[str]]:
    """(parameters, packable elements, elements of unpacked >= 2-D weights by module type) of ``model``
    (a meta model too: nothing is read); ``stored``: the checkpoint's tensor names, where known.

    A parameter shared by two modules (tied embeddings) counts once, as ``model.parameters()``
    yields it once, and so does a tied copy not yet sharing it (the packer's ``packed_ties``: T5's
    ``shared``, encoder and decoder ``embed_tokens`` and ``lm_head`` once) unless ``stored`` holds it
    too (:func:`_tied_copies`); packable is what the packer packs (its own predicates).
    """
    packable_ids = _packable(model)
    owner: dict[int, str] = {}
    for m in model.modules():
        for p in m._parameters.values():
            if p is not None:
                owner.setdefault(id(p), type(m).__name__)
    params = packable = 0
    unpacked: Counter[str] = Counter()
    for p in _weights_of(model, stored):
        n = p.numel()
        params += n
        if id(p) in packable_ids:
            packable += n
        elif p.dim() >= 2:
            unpacked[owner.get(id(p), "?")] += n
    return params, packable, unpacked


def packable_rows(model: nn.Module, stored: Collection[str] | None = None) -> tuple[tuple[int, int], ...]:
    """((K, rows), ...) of the matrices the packer packs, K ascending: a layout pads each row's K
    columns (an expert's matrix is its rows; a tied weight counts once)."""
    ids = _packable(model)
    rows: Counter[int] = Counter()
    for p in _weights_of(model, stored):
        if id(p) in ids:
            rows[p.shape[-1]] += math.prod(p.shape[:-1])  # not numel // K: K may be 0
    return tuple(sorted(rows.items()))


def weights_bytes(packable: int, other_bytes: int, layout: str, rows: tuple[tuple[int, int], ...] = ()) -> int:
    """Bytes of the weights: ``packable`` elements at ``layout``'s planning bits, ``other_bytes`` as they
    are; ``rows`` (:func:`packable_rows`) adds the columns the layout pads each matrix's rows with and
    its per-row tables (``Layout.row_bytes``)."""
    lay = LAYOUTS.get(layout)
    if lay is None or lay.bits is None:
        known = [name for name, lay in LAYOUTS.items() if lay.bits is not None]
        if lay is None:
            raise GlydError(f"unknown layout {layout!r}; choose one of {', '.join(known)}")
        raise GlydError(f"layout {layout!r} has no planning bits a weight (Layout.bits) to count its weights with; "
                        f"choose one of {', '.join(known)}")
    padding = sum(n * (lay.padded_cols(k) - k) for k, n in rows)
    tables = sum(n * lay.row_bytes(k) for k, n in rows) if lay.row_bytes is not None else 0
    return int(round((packable + padding) * lay.bits / 8 + tables)) + other_bytes


@dataclass(frozen=True)
class WeightsCount:
    """A model's weights as the packer will hold them: ``packable`` elements (``rows``: their matrices'
    rows by K, :func:`packable_rows`), ``other_bytes`` as they are held (bf16, or a float32 norm's 4 bytes a value)."""

    packable: int
    other_bytes: int
    rows: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, model: nn.Module, stored: Collection[str] | None = None) -> WeightsCount:
        """``model``'s count (``stored``: the names of the checkpoint it will be loaded from, which may
        hold a tied copy apart: :func:`count_weights`)."""
        # the rest as it will be held: an empty model's from a bf16 folder (its meta dtype is the
        # class default, float32 for diffusers), a loaded one's as it is (a float32 norm stays float32)
        ids = _packable(model)
        other = sum(p.numel() * (_BF16 if p.is_meta else p.element_size())
                    for p in _weights_of(model, stored) if id(p) not in ids)
        return cls(count_weights(model, stored)[1], other, packable_rows(model, stored))

    def need(self, layout: str) -> int:
        return weights_bytes(self.packable, self.other_bytes, layout, self.rows)


def human(n: int) -> str:
    """``n`` bytes in the largest binary unit it reaches (``"15.30 GiB"``, ``"1.50 KiB"``)."""
    for unit, power in (("TiB", 4), ("GiB", 3), ("MiB", 2), ("KiB", 1)):
        if n >= 1024**power:
            return f"{n / 1024**power:.2f} {unit}"
    return f"{n} bytes"


def shown(limit: int, *sizes: int):
    """The formatter of a message comparing ``sizes`` with ``limit``: :func:`human`, or bytes when
    one of them would read the same as the limit it differs from (a byte over read "fits")."""
    if any(n != limit and human(n) == human(limit) for n in sizes):
        return lambda n: f"{n:,} bytes"
    return human


def fit_layout(count: WeightsCount, layout: str, limit: int) -> str:
    """The layout to pack with under ``limit`` bytes of weights, said in one log line (INFO).

    ``"auto"``: the first of :data:`SPEED_ORDER` (fastest first) whose weights fit; an explicit
    layout: itself if it fits. Raises ``GlydError`` before anything is packed when nothing fits.

    >>> c = WeightsCount(packable=8 * 2**30, other_bytes=0)          # 8 Gi weights: fixed12 12.05 GiB
    >>> fit_layout(c, "auto", 12 * 2**30), fit_layout(c, "auto", 13 * 2**30)
    ('dense11', 'fixed12')
    """
    if layout != "auto":
        need = count.need(layout)
        size = shown(limit, need)
        if need > limit:
            fits = [name for name in SPEED_ORDER if name in LAYOUTS and count.need(name) <= limit]
            hint = f"; {fits[0]} needs {size(count.need(fits[0]))}" if fits else ""
            raise GlydError(f"layout {layout}: its weights need {size(need)}, {_LIMIT_NAME.get()} allows {size(limit)}"
                            f"{hint} (nothing was packed)")
        log.info("layout %s: weights %s fit the %s allowed", layout, size(need), size(limit))
        return layout
    needs = {name: count.need(name) for name in SPEED_ORDER if name in LAYOUTS and LAYOUTS[name].bits is not None}
    if not needs:
        raise GlydError(f"{_LIMIT_NAME.get()}: no registered layout has planning bits to count weights with")
    size = shown(limit, *needs.values())
    too_big: list[str] = []
    for name, need in needs.items():
        if need <= limit:
            why = f"weights {size(need)} fit the {size(limit)} allowed"
            if too_big:
                why = f"{'; '.join(too_big)}, {size(limit)} allowed; {name}'s {size(need)} fit"
            log.info("layout auto: %s (%s)", name, why)
            return name
        too_big.append(f"{name} needs {size(need)}")
    small = min(needs, key=needs.get)
    raise GlydError(f"{_LIMIT_NAME.get()} {size(limit)}: no layout fits the weights; the smallest, {small}, needs "
                    f"{size(needs[small])} (nothing was packed)")


def check_packed(packer: Any, count: WeightsCount, limit: int) -> None:
    """After packing: warn (the model is loaded) when the packed bytes passed the limit that the
    planning bits a weight said they would fit (weights far from those the bits were measured on)."""
    took = packer.packed_bytes + count.other_bytes
    if took > limit:
        planned = count.need(packer.layout) if packer.layout in LAYOUTS else None
        size = shown(limit, took, *([] if planned is None else [planned]))
        log.warning("the weights take %s packed, more than the %s %s allows (counted before packing: "
                    "%s, at %s's planning bits a weight)", size(took), size(limit), _LIMIT_NAME.get(),
                    "?" if planned is None else size(planned), packer.layout)


def stored_bytes(path: Path, files: list[str]) -> int:
    """The bytes of the tensors of ``files`` (safetensors under ``path``), headers left out: what loading them takes."""
    return sum(i.end - i.begin for f in files for i in read_header(path / f).tensors.values())


def check_stored(path: Path, files: list[str], limit: int) -> None:
    """A glyd folder keeps its layout: refuse it, before loading, when its weights as stored (the
    tensors of the safetensors files, as loaded and as ``glyd fit`` counts them: not the headers)
    pass ``limit``."""
    stored = stored_bytes(path, files)
    size = shown(limit, stored)
    if stored > limit:
        raise GlydError(f"{show_path(path)}: its weights take {size(stored)} as stored, {_LIMIT_NAME.get()} allows "
                        f"{size(limit)} (a glyd folder keeps the layout it was saved with)")
    log.info("%s: weights %s as stored fit the %s allowed", show_path(path), size(stored), size(limit))
