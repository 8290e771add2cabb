"""GPUs for ``glyd fit --gpu``: a card's name, or a size read the way users mean it.

A card's memory is what ``nvidia-smi`` prints as its total (the "Memory-Usage" column, in MiB): the
H200's was read on the lent H200 (``benchmarks/RESULTS.md``, fit section); the others are those
public ``nvidia-smi`` outputs show for the card (two drivers' figures where they differ: the smaller
is taken). A card sold as "141 GB" holds 143,771 MiB (140.4 GiB), not 141 x 10^9 bytes (131.3 GiB):
a size in GB that is one a card is sold as (``141GB``, ``80GB``, ``24GB`` ...) is read as the
smallest of those cards' memory, and the reading is said; any other ``GB`` is 10^9 bytes, ``GiB``
2^30, ``MiB`` 2^20 (``nvidia-smi``'s unit), and a bare number GiB.

>>> g = parse_gpu("h200")
>>> g.bytes == 143_771 * 2**20, g.reading
(True, 'NVIDIA H200: 143,771 MiB (140.40 GiB), its nvidia-smi total')
>>> parse_gpu("141GB").bytes == g.bytes
True
>>> parse_gpu("100GB").reading
'100GB read as 100 x 10^9 bytes (93.13 GiB)'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from glyd.errors import GlydError
from glyd.hf.memory import read_size

__all__ = ["CARDS", "Card", "Gpu", "parse_gpu", "parse_size"]

MiB = 2**20
GiB = 2**30


@dataclass(frozen=True)
class Card:
    """One card: its name, its nvidia-smi total in MiB, the size it is sold as (GB), other names."""

    name: str
    mib: int
    sold_gb: int
    aliases: tuple[str, ...] = ()


#: key -> card. Totals: nvidia-smi's, in MiB (see the module docstring for the sources).
CARDS: dict[str, Card] = {
    "h200": Card("NVIDIA H200", 143_771, 141, ("h200-141gb", "h200-sxm", "h200-nvl")),
    "h100-80gb": Card("NVIDIA H100 80GB HBM3", 81_559, 80, ("h100", "h100-sxm", "h100-80gb-hbm3")),
    "a100-80gb": Card("NVIDIA A100 80GB", 81_920, 80, ("a100-sxm4-80gb", "a100-80gb-pcie")),
    "a100-40gb": Card("NVIDIA A100 40GB", 40_536, 40, ("a100", "a100-sxm4-40gb", "a100-pcie-40gb")),  # some drivers: 40,960
    "l40s": Card("NVIDIA L40S", 46_068, 48),
    "a40": Card("NVIDIA A40", 46_068, 48),
    "rtx-a6000": Card("NVIDIA RTX A6000", 49_140, 48, ("a6000",)),
    "rtx-6000-ada": Card("NVIDIA RTX 6000 Ada Generation", 49_140, 48, ("6000-ada",)),
    "4090": Card("NVIDIA GeForce RTX 4090", 24_564, 24, ("rtx-4090", "rtx4090")),
    "3090": Card("NVIDIA GeForce RTX 3090", 24_576, 24, ("rtx-3090", "rtx3090")),
    "3090-ti": Card("NVIDIA GeForce RTX 3090 Ti", 24_564, 24, ("rtx-3090-ti",)),
    "l4": Card("NVIDIA L4", 23_034, 24),
    "t4": Card("NVIDIA T4", 15_360, 16, ("tesla-t4",)),
}
_BY_NAME = {n: key for key, card in CARDS.items() for n in (key, *card.aliases)}

#: The largest --gpu glyd fit takes (1 EiB): a bound, not a GPU.
MAX_GPU_BYTES = 2**60
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]i?b)?\s*$", re.IGNORECASE)
_SCALE = {"k": 1, "m": 2, "g": 3, "t": 4}


@dataclass(frozen=True)
class Gpu:
    """GPU memory in bytes and how ``--gpu`` was read (printed under fit's table)."""

    bytes: int
    reading: str


def parse_size(text: str) -> int:
    """A size with its unit, in bytes: ``"16GB"`` is 16e9 bytes, ``"16GiB"`` 16 x 2^30, a bare ``"16"`` GiB.

    >>> parse_size("16GB"), parse_size("16GiB") == parse_size("16") == 16 * 2**30
    (16000000000, True)
    """
    size = read_size(text)  # the loader's memory_limit reads sizes the same way (a bare number: GiB here)
    if size is None:
        names = ", ".join(CARDS)
        raise GlydError(f"--gpu {_short(str(text))}: give a card ({names}) or a memory size with its unit, e.g. 24GB, "
                        "80GiB, 143771MiB (nvidia-smi's total) or 24 (GiB)")
    if size <= 0:
        raise GlydError(f"--gpu {_short(str(text))}: must be positive")
    if size > MAX_GPU_BYTES:
        raise GlydError(f"--gpu {_short(str(text))}: more than any GPU holds (at most 2^60 bytes)")
    return size


def _short(text: str) -> str:
    return repr(text) if len(text) <= 40 else repr(text[:37] + "...")


def _card(key: str) -> Gpu:
    c = CARDS[key]
    return Gpu(c.mib * MiB, f"{c.name}: {c.mib:,} MiB ({c.mib * MiB / GiB:.2f} GiB), its nvidia-smi total")


def parse_gpu(text: str) -> Gpu:
    """``--gpu`` as fit reads it: a card's name, a card's sold size in GB, or a size (see the module)."""
    key = str(text).strip().lower().replace("_", "-").replace(" ", "-").removeprefix("nvidia-")
    if key in _BY_NAME:
        return _card(_BY_NAME[key])
    size = parse_size(text)
    m = _SIZE.match(str(text))
    unit = (m.group(2) or "").lower() if m else ""
    if unit == "gb" and float(m.group(1)) == int(float(m.group(1))):
        sold = sorted((c.mib, k) for k, c in CARDS.items() if c.sold_gb == int(float(m.group(1))))
        if sold:
            mib, first = sold[0]
            names = ", ".join(f"{CARDS[k].name} {CARDS[k].mib:,}" for _, k in sold)
            return Gpu(mib * MiB, f"{text.strip()} read as the memory of a card sold as {int(float(m.group(1)))} GB: "
                       f"{mib:,} MiB ({mib * MiB / GiB:.2f} GiB), the smallest of {names} MiB (name the card, e.g. "
                       f"--gpu {first}, for its own; {size:,} bytes exactly: --gpu {size / GiB:.2f}GiB)")
    if unit in ("", "gib"):
        how = f"{size / GiB:g} x 2^30 bytes"
    elif unit.endswith("ib"):
        how = f"{float(m.group(1)):g} x 2^{10 * _SCALE[unit[0]]} bytes ({size / GiB:.2f} GiB)"
    else:
        how = f"{float(m.group(1)):g} x 10^{3 * _SCALE[unit[0]]} bytes ({size / GiB:.2f} GiB)"
    return Gpu(size, f"{text.strip()} read as {how}")
