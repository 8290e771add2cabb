"""Checks of kernel config fields for their ``__post_init__``, where ``isinstance`` alone is wrong:
``True`` is an ``int`` and a table's ``"false"`` is truthy, and either reached a kernel (a failure
there, or a variant silently on).

>>> import dataclasses
>>> @dataclasses.dataclass(frozen=True)
... class Cfg:
...     fixup: bool = False
...     stages: int = 3
...     def __post_init__(self):
...         flags(self, "fixup")
...         ints(self, 1, 8, "stages")
>>> Cfg(stages=True)
Traceback (most recent call last):
ValueError: Cfg.stages must be an int in 1..8, got True
"""

from __future__ import annotations

from typing import Any

__all__ = ["flags", "ints", "check_int"]


def flags(cfg: Any, *names: str) -> None:
    """Raise ValueError unless every named field of ``cfg`` is a bool."""
    for name in names:
        v = getattr(cfg, name)
        if not isinstance(v, bool):
            raise ValueError(f"{type(cfg).__name__}.{name} must be true or false, got {v!r}")


def ints(cfg: Any, lo: int, hi: int | None, *names: str) -> None:
    """Raise ValueError unless every named field of ``cfg`` is an int (not a bool) in ``lo..hi``
    (``hi`` None: no end)."""
    for name in names:
        check_int(f"{type(cfg).__name__}.{name}", getattr(cfg, name), lo, hi)


def check_int(what: str, v: Any, lo: int, hi: int | None = None) -> None:
    """Raise ValueError naming ``what`` unless ``v`` is an int (not a bool) in ``lo..hi`` (``hi`` None: no end)."""
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        raise ValueError(f"{what} must be an int {f'>= {lo}' if hi is None else f'in {lo}..{hi}'}, got {v!r}")
