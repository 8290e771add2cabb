"""``glyd pack | unpack`` (:mod:`glyd.apps.cli_store`): destinations that cannot be made get one line naming why."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from glyd.cli import main

sys.path.insert(0, str(Path(__file__).parent))
from serve_model import build_chat_model  # noqa: E402


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    pytest.importorskip("transformers")
    return build_chat_model(tmp_path_factory.mktemp("cli-store") / "bf16")


def test_a_destination_under_a_file_names_the_file_that_is_not_a_folder(bf16, tmp_path, capsys):
    # it was "<absolute path of the file>: File exists", from mkdir
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["pack", str(bf16), str(blocker / "sub" / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"glyd pack: error: {blocker / 'sub' / 'out'}: {blocker} is a file, not a folder"
    assert blocker.read_text() == "" and sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
