"""``glyd fit --gpu``: cards by name, sizes read the way users mean them, and the reading said."""

from __future__ import annotations

import pytest

from glyd.apps.fit_gpus import CARDS, parse_gpu, parse_size
from glyd.errors import GlydError

MiB, GiB = 2**20, 2**30


@pytest.mark.parametrize("text, mib", [
    ("h200", 143_771), ("H200", 143_771), ("nvidia-h200", 143_771), ("h100-80gb", 81_559), ("h100", 81_559),
    ("a100-80gb", 81_920), ("a100-40gb", 40_536), ("l40s", 46_068), ("4090", 24_564), ("RTX 4090", 24_564),
    ("3090", 24_576), ("rtx_a6000", 49_140), ("t4", 15_360),
])
def test_cards_by_name(text, mib):
    g = parse_gpu(text)
    assert g.bytes == mib * MiB and f"{mib:,} MiB" in g.reading and "nvidia-smi total" in g.reading


def test_a_size_a_card_is_sold_as_is_that_cards_memory():
    g = parse_gpu("141GB")  # the H200's 141 GB: not 141e9 bytes (131.3 GiB), which bf16 70B would not fit
    assert g.bytes == 143_771 * MiB
    assert g.reading.startswith("141GB read as the memory of a card sold as 141 GB: 143,771 MiB (140.40 GiB)")
    assert "--gpu 131.32GiB" in g.reading  # how to ask for 141e9 bytes exactly
    eighty = parse_gpu("80GB")  # two cards: the smaller, both named
    assert eighty.bytes == 81_559 * MiB and "81,920" in eighty.reading
    assert parse_gpu("48GB").bytes == 46_068 * MiB


@pytest.mark.parametrize("text, size, how", [
    ("100GB", 100 * 10**9, "100 x 10^9 bytes"), ("141GiB", 141 * GiB, "141 x 2^30 bytes"),
    ("143771MiB", 143_771 * MiB, "143771 x 2^20 bytes"), ("24", 24 * GiB, "24 x 2^30 bytes"),
    ("141.5GB", 141_500_000_000, "141.5 x 10^9 bytes"),
])
def test_other_sizes_are_read_as_typed_and_said(text, size, how):
    g = parse_gpu(text)
    assert g.bytes == size and how in g.reading and g.reading.startswith(f"{text} read as")


@pytest.mark.parametrize("bad", ["", "h900", "24G", "-4GB", "1e9"])
def test_bad_gpus_name_the_choices(bad):
    with pytest.raises(GlydError, match=r"--gpu .*give a card \(h200, h100-80gb"):
        parse_gpu(bad)
    with pytest.raises(GlydError, match="must be positive"):
        parse_gpu("0GB")


def test_every_card_is_sold_at_least_as_large_as_it_holds_in_gib():
    # a sanity check of the table: a card sold as N GB holds between 0.9 N GB and N GiB + 3%
    for key, card in CARDS.items():
        assert 0.9 * card.sold_gb * 10**9 <= card.mib * MiB <= 1.03 * card.sold_gb * GiB, key


def test_parse_size_is_exact():
    assert parse_size("16GB") == 16 * 10**9 and parse_size("16") == 16 * GiB
