"""A path with a line break (or a terminal escape) in it is printed quoted, so that glyd's one-line
errors stay one line and say exactly which path (``glyd.errors.show_path``)."""

from __future__ import annotations

import json

import pytest

from glyd.errors import DestinationExistsError, FormatError, GlydError
from glyd.store import CheckpointReader
from glyd.store.folder import info, pack_folder, unpack_folder
from store_helpers import make_model_folder, make_packed


@pytest.fixture
def odd(tmp_path):
    """A folder whose name holds a line break and an escape character."""
    path = tmp_path / "two\nlines\x1b[31m"
    path.mkdir()
    return path


def _one_line(exc: BaseException, path) -> str:
    msg = str(exc)
    assert "\n" not in msg and "\x1b" not in msg, msg
    assert repr(str(path)) in msg, msg  # the exact path, quoted
    return msg


def test_pack_folder_names_an_odd_source_on_one_line(odd, tmp_path):
    with pytest.raises(FormatError) as info_:
        pack_folder(odd, tmp_path / "out", progress=False)  # no weights in it
    _one_line(info_.value, odd)
    with pytest.raises(FormatError) as info_:
        pack_folder(odd / "missing", tmp_path / "out", progress=False)
    _one_line(info_.value, odd / "missing")


def test_pack_folder_names_an_odd_destination_on_one_line(odd, tmp_path):
    src = tmp_path / "src"
    make_model_folder(src)
    (odd / "x").write_text("taken")
    with pytest.raises(DestinationExistsError) as info_:
        pack_folder(src, odd, progress=False)
    _one_line(info_.value, odd)


def test_a_damaged_checkpoint_in_an_odd_folder_is_named_on_one_line(odd, tmp_path):
    packed = make_packed(odd)
    manifest = packed / "glyd.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "format": "other"}))
    for call in (lambda: CheckpointReader(packed), lambda: info(packed),
                 lambda: unpack_folder(packed, tmp_path / "out", progress=False)):
        with pytest.raises(GlydError) as info_:
            call()
        _one_line(info_.value, packed / "glyd.json")
