"""The base class of the two page stores: one ``append``, one set of argument checks, for both codes."""

from __future__ import annotations

import pytest
import torch

from glyd.errors import FormatError
from glyd.kv.fixed import FixedPageStore
from glyd.kv.pages import PageStore
from glyd.kv.store import PageStoreBase

from .conftest import all_bf16_patterns, bits_equal

STORES = [PageStore, FixedPageStore]


@pytest.mark.parametrize("cls", STORES)
def test_one_base_class(cls):
    assert issubclass(cls, PageStoreBase)
    assert cls.append is PageStoreBase.append and cls.from_bf16.__func__ is PageStoreBase.from_bf16.__func__


@pytest.mark.parametrize("cls", STORES)
def test_append_to_a_ragged_store_is_refused(cls):
    # PageStore's copy of append had lost this check: appending to a store built with per-sequence
    # lengths wrote the new tokens after the longest sequence and left lens stale.
    x = torch.randn(2, 1, 40, 16).to(torch.bfloat16)
    st = cls.from_bf16(x, torch.tensor([40, 21]), page=16)
    with pytest.raises(FormatError, match="read-only"):
        st.append(x[:, :, :1])


@pytest.mark.parametrize("cls", STORES)
@pytest.mark.parametrize("kw", [dict(batch=0), dict(batch=-1), dict(heads=0), dict(head_dim=0), dict(head_dim=-4),
                                dict(page=0), dict(page=6), dict(head_dim=6), dict(batch=1.5)])
def test_bad_arguments(cls, kw):
    args = dict(batch=1, heads=1, head_dim=16, page=16) | kw
    with pytest.raises(FormatError):
        cls(**args)


@pytest.mark.parametrize("cls", STORES)
def test_every_pattern_through_the_base(cls):
    x = all_bf16_patterns().reshape(2, 2, 256, 64)
    st = cls(2, 2, 64, page=32)
    st.append(x[:, :, :100])
    st.append(x[:, :, 100:101])
    st.append(x[:, :, 101:])
    assert st.n_pages == 8 and st.n_raw == 0
    assert bits_equal(st.to_bf16(), x)
    assert bits_equal(st.pages(2, 3), x[:, :, 64:96])
    with pytest.raises(FormatError, match="outside"):
        st.pages(3, 9)
    want = 2 * 2 * 8 * st.block_nbytes() + st._stream_len * st._stream.element_size()
    assert st.nbytes == want
