"""Which kernel runs a product: kernel classes that say whether they can run a problem (and why
not), and per GPU a table of what a sweep measured fastest.

A kernel family is a class with a ``name``, the ``layout`` it multiplies, its own ``Config``
dataclass, ``can_implement(problem, device, config) -> (ok, why)`` and ``launch``. The choice for
a product is data: ``kernels/tables/<GPU name>.json`` (or the same file in the folder
``GLYD_TABLES`` names, read first) lists, per layout, shape class and M bucket, candidates
``{"kernel": name, "config": {...}}`` in order of preference; the first that can run on the device
and that ``GLYD_DISABLED_KERNELS`` does not name is taken (``kernels/tables/README.md``). The
families are those of the layouts' entries (``glyd.codec.LAYOUTS``). A GPU with no table of its
own uses the ``fallback`` table (the H200's,
the GPU these kernels were tuned on): its Hopper-only kernels say they cannot run on
other GPUs, so the next candidate runs there, and on the CPU (Triton's interpreter) every Gluon
candidate steps aside the same way.

>>> from glyd.kernels.registry import Problem, shape_class, m_bucket   # no Triton imported
>>> shape_class(18944, 3584), shape_class(512, 3584), m_bucket(5)
('gate', 'kv', '5-8')
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from glyd import _env
from glyd.codec.layout import LAYOUTS
from glyd.codec.packed import Packed
from glyd.kernels import _plan

log = logging.getLogger(__name__)

__all__ = ["Problem", "Device", "Kernel", "KERNELS", "kernel_class", "kernel_for", "choose", "choose_uncached",
           "candidates", "check_table", "disabled", "reset", "on_reset", "table_file", "table_for", "layout_times",
           "shape_class", "m_bucket", "m_range", "M_BUCKETS", "SHAPE_CLASSES"]

TABLES = Path(__file__).with_name("tables")
#: The table of a GPU that has none of its own (its kernels are skipped where they cannot run).
FALLBACK = "NVIDIA H200"
#: The page codes and ops of a table's ``kv`` section (``glyd.kv.registry.CODES``, ``OPS``; that
#: module imports this one, a test keeps them equal).
KV_CODES = ("kvf12", "kvtiered")
KV_OPS = ("attention", "write")

class _Families(Mapping):
    """Every kernel family, key -> ``"module:Class"``: the ``kernels`` of every layout's entry in
    ``glyd.codec.LAYOUTS`` (the one list; read live, so a layout registered later is in it)."""

    def _all(self) -> dict[str, str]:
        return {key: ref for lay in LAYOUTS.values() for key, ref in lay.kernels.items()}

    def __getitem__(self, key: str) -> str:
        return self._all()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


#: Kernel families: name -> "module:class" (imported when first asked for: most import Triton).
KERNELS: Mapping[str, str] = _Families()

#: M buckets of the tables: (name, first M, last M) (None: no end).
M_BUCKETS: tuple[tuple[str, int, int | None], ...] = (
    ("1", 1, 1), ("2", 2, 2), ("3", 3, 3), ("4", 4, 4), ("5-8", 5, 8), ("9-16", 9, 16), ("17-32", 17, 32),
    ("33-64", 33, 64), ("65-128", 65, 128), ("129-255", 129, 255), ("256-511", 256, 511),
    ("512+", 512, None),
)

#: Shape classes of an N x K matrix (``shape_class``), with one example each from a 7B model where
#: it has one. Weights: kv <= 2^22 < qo, qkv <= 2^24 < gate < 2^27 <= big; tall: K >= 8192 and
#: K > N (down projections); wide: N >= 65536 (lm_heads); qkv: K < N <= 2K (a merged q|k|v).
SHAPE_CLASSES: dict[str, str] = {
    "kv": "k, v (512 x 3584)", "qo": "q, o (3584 x 3584)", "qkv": "merged q|k|v (4608 x 3584)",
    "gate": "gate, up (18944 x 3584)", "big": "merged gate|up (37888 x 3584)", "tall": "down (3584 x 18944)",
    "wide": "lm_head below 2^27 weights", "wide_big": "lm_head (152064 x 3584)", "tall_small": "a short down",
    "tall_tiny": "a tiny down", "wide_small": "a wide matrix with K <= 256", "wide_tiny": "a wide one, K <= 64",
    "tall_wide": "N >= 65536 and K > N",
}


def shape_class(n: int, k: int) -> str:
    """The class of an N x K matrix in the tables (``SHAPE_CLASSES``)."""
    w = n * k
    tall = k >= 8192 and k > n
    wide = n >= 65536
    if w <= 1 << 22:
        return "tall_tiny" if tall else "wide_tiny" if wide else "kv"
    if w <= 1 << 24:
        if tall:
            return "tall_small"
        if wide:
            return "wide_small"
        return "qkv" if k < n <= 2 * k else "qo"
    if tall:
        return "tall_wide" if wide else "tall"
    if wide:
        return "wide_big" if w >= 1 << 27 else "wide"
    return "big" if w >= 1 << 27 else "gate"


def m_range(m: int) -> tuple[int, int]:
    """(first M, last M) of the M bucket (``M_BUCKETS``) that ``m`` >= 1 falls in (no end: ``2**62``).

    >>> m_range(100), m_range(4096)
    ((65, 128), (512, 4611686018427387904))
    """
    for _, lo, hi in M_BUCKETS:
        if m >= lo and (hi is None or m <= hi):
            return lo, (1 << 62) if hi is None else hi
    raise ValueError(f"M must be >= 1, got {m}")


def m_bucket(m: int) -> str:
    """The name of the M bucket (``M_BUCKETS``) that ``m`` >= 1 falls in."""
    for name, lo, hi in M_BUCKETS:
        if m >= lo and (hi is None or m <= hi):
            return name
    raise ValueError(f"M must be >= 1, got {m}")


@dataclass(frozen=True)
class Problem:
    """One product: x [M, K] @ W^T for a packed W [N, K] of ``layout`` (``kp``: its padded K,
    ``version``: the layout's format version of W's arrays)."""

    layout: str
    m: int
    n: int
    k: int
    kp: int
    version: int = 1


@dataclass(frozen=True)
class Device:
    """What a kernel needs to know of where it runs. ``features``: ``gluon`` (Triton's Gluon runs
    here: a CUDA GPU, not the interpreter), ``wgmma`` (Gluon's Hopper MMA, sm_90), ``tma`` (Gluon's
    Hopper TMA and mbarriers)."""

    type: str
    name: str
    capability: tuple[int, int] | None = None
    sms: int = 8
    interpreting: bool = False
    features: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def of(cls, device: torch.device) -> Device:
        """The description of ``device`` (cached per device)."""
        return _describe(device.type, device.index if device.type != "cuda" else _index(device))


def _index(device: torch.device) -> int:
    return torch.cuda.current_device() if device.index is None else device.index


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
        return True
    except ImportError as exc:
        log.info("%s does not import (%s)", module, exc)
        return False


@functools.lru_cache(maxsize=None)
def _describe(kind: str, index: int | None) -> Device:
    interp = _env.interpreting()
    if kind != "cuda":
        return Device(kind, kind, interpreting=interp)
    props = torch.cuda.get_device_properties(index)
    cap = (props.major, props.minor)
    feats = set()
    if not interp and _importable("triton.experimental.gluon.language.nvidia.ampere"):
        feats.add("gluon")
        if cap[0] == 9 and _importable("triton.experimental.gluon.language.nvidia.hopper"):
            feats.add("wgmma")
            if _importable("triton.experimental.gluon.nvidia.hopper"):
                feats.add("tma")
    return Device("cuda", props.name, cap, props.multi_processor_count, interp, frozenset(feats))


class Kernel:
    """A kernel family (subclasses live in the family's file, beside its kernels; the layout's entry
    in ``glyd.codec.LAYOUTS`` names them). ``can_implement`` and ``make_config`` may look at N, K,
    padded K and the device, not at M: ``choose`` caches its answer per M bucket."""

    name: ClassVar[str]
    layout: ClassVar[str]
    Config: ClassVar[type]
    #: A family of expert products (``glyd.kernels.experts``): its launch takes expert ids, no linear runs it.
    experts: ClassVar[bool] = False
    #: ``plan`` works for any M (it looks at x's device and K, not at M): one kept plan serves every M of
    #: the bucket (``glyd.kernels._plan``), so a prompt of a new length takes an earlier prompt's plan.
    any_rows: ClassVar[bool] = False

    @classmethod
    def can_implement(cls, problem: Problem, device: Device, config: Any) -> tuple[bool, str]:
        """(True, "") if this kernel can run ``problem`` on ``device`` with ``config``, else (False, why)."""
        if problem.layout != cls.layout:
            return False, f"{cls.name} multiplies {cls.layout} matrices, not {problem.layout}"
        return True, ""

    @classmethod
    def launch(cls, x2: torch.Tensor, packed: Any, bias: torch.Tensor | None, config: Any,
               out: torch.Tensor) -> torch.Tensor:
        """Write ``x2 @ W^T (+ bias)`` into ``out`` (bf16 [M, N]) and return it."""
        raise NotImplementedError

    @classmethod
    def plan(cls, x2: torch.Tensor, packed: Any, bias: torch.Tensor | None, config: Any) -> Callable:
        """``launch`` for every x like ``x2`` (shape, strides, address modulo 16), this matrix and a
        bias like ``bias`` (or none), as ``run(x2, bias, out, arrays) -> out`` (``arrays``: the
        matrix's arrays in its layout's order), kept by ``glyd.kernels._plan``. It must hold none
        of the arrays. This one calls ``launch``; a family whose launch does host work worth
        keeping does that work here and launches through ``glyd.kernels._plan.Launch``."""
        layout, shape, version = packed.layout, tuple(packed.shape), packed.version
        names = LAYOUTS[layout].arrays

        def run(x2, bias, out, arrays):
            return cls.launch(x2, Packed.trusted(layout, shape, dict(zip(names, arrays)), version), bias, config, out)

        return run

    @classmethod
    def make_config(cls, spec: dict[str, Any], problem: Problem) -> Any:
        """The family's Config from a table entry (values named in ``resolve`` are filled in)."""
        return cls.Config(**{k: cls.resolve(k, v, problem) for k, v in spec.items()})

    @classmethod
    def resolve(cls, key: str, value: Any, problem: Problem) -> Any:
        return value


class _Unavailable(Kernel):
    """Stands in for a family whose module does not import here."""

    why = ""

    @classmethod
    def can_implement(cls, problem, device, config):
        return False, cls.why


@functools.lru_cache(maxsize=None)
def kernel_class(name: str) -> type[Kernel]:
    """The kernel class registered as ``name`` (a stand-in that can run nothing if it does not import)."""
    if name not in KERNELS:
        raise ValueError(f"unknown kernel {name!r}; known: {', '.join(KERNELS)}")
    module, cls = KERNELS[name].split(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as exc:
        return type(f"Unavailable_{name}", (_Unavailable,), {"name": name, "layout": "", "why": f"{module}: {exc}"})


def kernel_for(config: Any) -> type[Kernel]:
    """The kernel class whose ``Config`` ``config`` is."""
    for name in KERNELS:
        kc = kernel_class(name)
        if getattr(kc, "Config", None) is type(config):
            return kc
    raise TypeError(f"{type(config).__name__} is not the config of any kernel ({', '.join(KERNELS)})")


def _table_dirs() -> list[Path]:
    """Where tables are looked for, in order: ``GLYD_TABLES`` (when set), then the package's own."""
    extra = _env.settings().tables
    if extra is None:
        return [TABLES]
    if not Path(extra).is_dir():
        raise ValueError(f"GLYD_TABLES={extra!r} is not a folder (it names a folder of <GPU name>.json tables)")
    return [Path(extra), TABLES]


def table_file(gpu: str) -> Path:
    """The table of ``gpu``: ``<gpu>.json`` (characters other than letters and digits as ``_``) in
    ``GLYD_TABLES``, else in ``kernels/tables/`` (that path also when neither has one)."""
    name = "".join(c if c.isalnum() else "_" for c in gpu) + ".json"
    return next((d / name for d in _table_dirs() if (d / name).is_file()), TABLES / name)


@functools.lru_cache(maxsize=None)
def _load_table(path: Path) -> dict[str, Any]:
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a JSON table ({exc})") from exc
    if isinstance(table, dict):
        _split_old_buckets(table)
    check_table(table, str(path))
    return table


#: M buckets of tables written before a bucket was split, and the buckets that took their rows.
OLD_BUCKETS: dict[str, tuple[str, ...]] = {"256+": ("256-511", "512+")}


def _split_old_buckets(table: dict[str, Any]) -> None:
    """A table's cells of ``OLD_BUCKETS`` (a table from before 2026-12-07) as cells of the buckets
    that split them, in place, where the table has no cell of its own there."""
    cells = [c for s in ("linear",) if isinstance(table.get(s), dict)
             for classes in table[s].values() if isinstance(classes, dict) for c in classes.values()]
    if isinstance(table.get("experts"), dict):
        cells += list(table["experts"].values())
    for cell in cells:
        if not isinstance(cell, dict):
            continue
        for old, new in OLD_BUCKETS.items():
            if old in cell:
                cands = cell.pop(old)
                for b in new:
                    cell.setdefault(b, cands)


def check_table(table: Any, where: str = "table") -> None:
    """Raise ValueError naming the place unless ``table`` has the tables' schema (``tables/README.md``):
    ``linear.<layout>.<shape class>.<M bucket>`` lists of ``{"kernel": a family of that layout,
    "config": {...}}``; optional ``experts.<layout>.<M bucket>`` and ``kv.<code>.<op>`` lists of
    candidates (their readers check the kernel names) and a ``layout`` section of times per ``"NxK"``."""
    if not isinstance(table, dict) or not isinstance(table.get("linear"), dict):
        raise ValueError(f"{where}: a table is a JSON object with a 'linear' object")
    buckets = {b for b, _, _ in M_BUCKETS}
    for layout, classes in table["linear"].items():
        if layout not in LAYOUTS or not isinstance(classes, dict):
            raise ValueError(f"{where}: linear.{layout}: unknown layout (known: {', '.join(LAYOUTS)})")
        for cls, cells in classes.items():
            if cls not in SHAPE_CLASSES or not isinstance(cells, dict):
                raise ValueError(f"{where}: linear.{layout}: unknown shape class {cls!r}")
            for bucket, cands in cells.items():
                if bucket not in buckets or not isinstance(cands, list) or not cands:
                    raise ValueError(f"{where}: linear.{layout}.{cls}: unknown M bucket {bucket!r} or no candidates")
                for c in cands:
                    if (not isinstance(c, dict) or c.get("kernel") not in LAYOUTS[layout].kernels
                            or not isinstance(c.get("config"), dict)):
                        raise ValueError(f"{where}: linear.{layout}.{cls}.{bucket}: bad candidate {c!r} (its kernel "
                                         f"must be one of {', '.join(LAYOUTS[layout].kernels)})")
    _check_cells(table, "experts", where, {lay: buckets for lay in LAYOUTS})
    _check_cells(table, "kv", where, {code: set(KV_OPS) for code in KV_CODES})
    _check_layout_times(table.get("layout", {}), where)


def _check_cells(table: dict[str, Any], section: str, where: str, keys: dict[str, set[str]]) -> None:
    """``<section>.<key>.<subkey>``: non-empty lists of ``{"kernel": str, "config": {...}}``."""
    if section not in table:
        return
    if not isinstance(table[section], dict):
        raise ValueError(f"{where}: {section}: must be an object of {', '.join(keys)}")
    for key, cells in table[section].items():
        if key not in keys or not isinstance(cells, dict):
            raise ValueError(f"{where}: {section}.{key}: unknown (known: {', '.join(keys)}) or not an object")
        for sub, cands in cells.items():
            if sub not in keys[key] or not isinstance(cands, list) or not cands:
                raise ValueError(f"{where}: {section}.{key}.{sub}: unknown (known: {', '.join(sorted(keys[key]))}) "
                                 "or not a list of candidates")
            for c in cands:
                if not isinstance(c, dict) or not isinstance(c.get("kernel"), str) or not isinstance(
                        c.get("config"), dict):
                    raise ValueError(f"{where}: {section}.{key}.{sub}: bad candidate {c!r} (one is "
                                     '{"kernel": name, "config": {...}})')
                span = c.get("batches")
                if "batches" in c and (section != "kv" or not (isinstance(span, list) and len(span) == 2 and all(
                        type(v) is int for v in span) and 1 <= span[0] <= span[1])):
                    raise ValueError(f"{where}: {section}.{key}.{sub}: 'batches' (kv cells only) must be [lo, hi] "
                                     f"sequences with 1 <= lo <= hi, got {span!r}")


def _check_layout_times(section: Any, where: str) -> None:
    """``{"shapes": {"NxK": {layout or "bf16": us}}}``: N, K positive, times positive numbers."""
    shapes = section.get("shapes", {}) if isinstance(section, dict) else None
    if not isinstance(shapes, dict) or not all(
            isinstance(times, dict) and all(isinstance(v, (int, float)) for v in times.values())
            for times in shapes.values()):
        raise ValueError(f"{where}: 'layout' must be {{'shapes': {{'NxK': {{layout or bf16: us}}}}}}")
    for key, times in shapes.items():
        n, x, k = key.partition("x")
        if not (x and n.isdigit() and k.isdigit() and int(n) > 0 and int(k) > 0) or not all(
                not isinstance(v, bool) and 0 < v < float("inf") for v in times.values()):
            raise ValueError(f"{where}: layout.shapes.{key}: a shape is 'NxK' (N, K >= 1) of times > 0 us, "
                             f"got {times!r}")


def table_for(device: Device) -> dict[str, Any]:
    """The table of ``device``'s GPU, or the fallback table."""
    own = table_file(device.name)
    return _load_table(own if own.is_file() else table_file(FALLBACK))


def layout_times(gpu: str) -> dict[str, Any] | None:
    """The kernel times per shape measured on ``gpu`` (its own table only), for layout="auto"."""
    path = table_file(gpu)
    return _load_table(path).get("layout") if path.is_file() else None


def candidates(problem: Problem, device: Device) -> list[dict[str, Any]]:
    """The table's candidates for ``problem``, in order of preference; a GPU's own table is followed by
    the fallback table's candidates, so a table that covers some cells only still runs every problem."""
    tables = [table_for(device)]
    if tables[0] is not _load_table(table_file(FALLBACK)):
        tables.append(_load_table(table_file(FALLBACK)))
    out: list[dict[str, Any]] = []
    for table in tables:
        by_bucket = table["linear"].get(problem.layout, {}).get(shape_class(problem.n, problem.k), {})
        out += [c for c in by_bucket.get(m_bucket(problem.m), ()) if c not in out]
    return out


def disabled() -> frozenset[str]:
    """The kernel families ``GLYD_DISABLED_KERNELS`` names (never chosen from a table)."""
    names = _env.settings().disabled_kernels
    unknown = [n for n in names if n not in KERNELS]
    if unknown:
        raise ValueError(f"GLYD_DISABLED_KERNELS names unknown kernel families {', '.join(unknown)} "
                         f"(known: {', '.join(KERNELS)})")
    return frozenset(names)


def choose(problem: Problem, device: Device) -> tuple[type[Kernel], Any]:
    """(kernel class, config) of the first candidate that can run ``problem`` on ``device``.

    Cached per layout, N, K, padded K, M bucket and device: the tables choose per M bucket, and no
    family's ``can_implement`` or config depends on M inside a bucket (a test holds every family to
    it; the format version is part of the key). Making the choice took 75-120 us of Python a call on the development machine, which an
    eager prefill of a small model (one product a linear) paid hundreds of times. ``reset()``
    forgets the choices (after changing ``GLYD_TABLES`` or ``GLYD_DISABLED_KERNELS``)."""
    return _choose_cell(problem.layout, m_bucket(problem.m), problem.n, problem.k, problem.kp, device, problem.version)


@functools.lru_cache(maxsize=8192)
def _choose_cell(layout: str, bucket: str, n: int, k: int, kp: int, device: Device,
                 version: int = 1) -> tuple[type[Kernel], Any]:
    first = next(lo for b, lo, _ in M_BUCKETS if b == bucket)
    return choose_uncached(Problem(layout, first, n, k, kp, version), device)


def choose_uncached(problem: Problem, device: Device) -> tuple[type[Kernel], Any]:
    """``choose`` made anew for this exact problem (no cache)."""
    why = []
    off = disabled()
    for cand in candidates(problem, device):
        if cand["kernel"] in off:
            why.append(f"{cand['kernel']}: disabled by GLYD_DISABLED_KERNELS")
            continue
        kc = kernel_class(cand["kernel"])
        cell = f"{problem.layout}.{shape_class(problem.n, problem.k)}.{m_bucket(problem.m)}"
        if kc.experts:  # a table's mistake: its launch takes expert ids
            why.append(f"{cand['kernel']}: a family of expert products")
            log.warning("table cell %s: skipped %s: a family of expert products, not of linears", cell, cand["kernel"])
            continue
        try:
            cfg = kc.make_config(dict(cand["config"]), problem)
        except (TypeError, ValueError) as exc:  # a table's mistake: said, not silently passed over
            why.append(f"{cand['kernel']}: bad config ({exc})")
            log.warning("table cell %s: skipped %s %s: bad config (%s)", cell, cand["kernel"], cand["config"], exc)
            continue
        ok, reason = kc.can_implement(problem, device, cfg)
        if ok:
            return kc, cfg
        why.append(f"{cand['kernel']}: {reason}")
    raise RuntimeError(f"no kernel can run {problem} on {device.name}: " + ("; ".join(why) or "no candidates"))


#: What ``reset`` calls besides its own: the caches of choices made elsewhere from the tables
#: (``glyd.kv.registry``'s; that module imports this one, so it hands its ``cache_clear`` in).
_RESETS: list[Callable[[], None]] = []


def on_reset(forget: Callable[[], None]) -> None:
    """Have ``reset`` call ``forget`` (a cache of choices made from the tables)."""
    _RESETS.append(forget)


def reset() -> None:
    """Forget the tables read and the choices made (they are read again at the next product)."""
    _load_table.cache_clear()
    _choose_cell.cache_clear()
    _plan.clear()
    for forget in _RESETS:
        forget()


def config_dict(config: Any) -> dict[str, Any]:
    """A config as a table entry holds it (every field)."""
    return dataclasses.asdict(config)
