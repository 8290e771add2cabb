"""The layouts every command takes, from the one list (``glyd.LAYOUTS``), and their help text.

>>> from glyd.apps.layouts import layout_names, eval_modes
>>> layout_names(auto=True)
['fixed12', 'tiered', 'dense11', 'auto']
>>> list(eval_modes())
['bf16', 'fixed12', 'tiered', 'dense11', 'auto', 'exact', 'exact-tiered', 'exact-dense11']
"""

from __future__ import annotations

from glyd.codec import LAYOUTS

__all__ = ["layout_names", "layout_help", "eval_modes", "kernel_layouts"]

#: What ``auto`` does, for help texts.
AUTO = "per matrix from the GPU's measured kernel times (fixed12 without them)"


def layout_names(auto: bool = False) -> list[str]:
    """Every registered layout's name, then ``auto`` if asked for."""
    return [*LAYOUTS, *(["auto"] if auto else [])]


def kernel_layouts() -> list[str]:
    """The layouts that have fused GPU kernels (what ``glyd bench`` times)."""
    return [name for name, lay in LAYOUTS.items() if lay.kernels]


def layout_help(auto: bool = False, default: str | None = None) -> str:
    """One line for ``--layout``: each layout and what it is."""
    parts = [f"{name}: {lay.about}" if lay.about else name for name, lay in LAYOUTS.items()]
    if auto:
        parts.append(f"auto: {AUTO}")
    return "; ".join(parts) + (f" (default {default})" if default else "")


def eval_modes() -> dict[str, tuple[str | None, bool]]:
    """``glyd eval``'s modes: name -> (layout, exact). ``bf16`` is the reference; a layout's name packs
    with it, ``exact-<layout>`` packs with it and multiplies bit-exactly as bf16 (``exact``: fixed12's)."""
    modes: dict[str, tuple[str | None, bool]] = {"bf16": (None, False)}
    modes.update({name: (name, False) for name in layout_names(auto=True)})
    modes["exact"] = ("fixed12", True)
    modes.update({f"exact-{name}": (name, True) for name in LAYOUTS if name != "fixed12"})
    return modes
