"""The distribution this package installs as, and the other product that shares its import name.

The registry's ``glyd`` (and ``glyd-gpu``) is a different, closed product that also installs the
import package ``glyd`` and a ``glyd`` command: installed into one environment, the two overwrite
each other's files. This project installs as ``glyd-lossless``; :func:`conflicts` finds the other
product beside this package (it reads only directory names, and a METADATA file when one matches).

>>> conflicts(Path("/nonexistent"))
[]
"""

from __future__ import annotations

import warnings
from email.parser import HeaderParser
from pathlib import Path

#: This project's distribution name (``pip install glyd-lossless``).
DIST_NAME = "glyd-lossless"
#: How this project's own summary starts: an install of it under the old name ``glyd`` is not a conflict.
SUMMARY_PREFIX = "Lossless compression of bf16 model weights"
#: Distributions of the other product (their dist-info folder names, normalised).
OTHER = ("glyd", "glyd_gpu")


def conflicts(site: Path | None = None) -> list[str]:
    """``"NAME VERSION"`` of each distribution of the other product installed in ``site`` (default:
    the folder this package is installed in)."""
    site = Path(__file__).resolve().parents[1] if site is None else site
    found = []
    for name in OTHER:
        for info in sorted(site.glob(f"{name}-*.dist-info")):
            try:
                meta = HeaderParser().parsestr((info / "METADATA").read_text(encoding="utf-8", errors="replace"))
            except OSError:
                meta = {}
            if str(meta.get("Summary", "")).startswith(SUMMARY_PREFIX):
                continue  # this project, installed under its earlier name
            found.append(f"{meta.get('Name') or name} {meta.get('Version') or '?'}")
    return found


def warn_conflicts(site: Path | None = None) -> None:
    """One RuntimeWarning when the other product is installed beside this package."""
    try:
        others = conflicts(site)
    except OSError:
        return
    if others:
        warnings.warn(
            f"this environment also has {', '.join(others)} installed: a different product that installs the same "
            f"import package 'glyd' and command 'glyd', so each overwrites the other's files; keep one "
            f"(pip uninstall {' '.join(o.split()[0] for o in others)}, or pip uninstall {DIST_NAME}) or use "
            f"separate environments", RuntimeWarning, stacklevel=3)
