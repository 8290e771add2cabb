"""``glyd pack | unpack | info`` (:mod:`glyd.apps.cli_store`): destinations that cannot be made get one
line naming why; info quotes a tensor name that would break its table."""

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


def test_info_quotes_a_tensor_name_that_would_break_its_table(tmp_path, capsys):
    # a name read from the shard with a line break and a terminal escape was printed as it is: it
    # forged a row of the table and coloured the terminal
    import torch

    from glyd.store import CheckpointWriter

    evil = "evil\n| fake.weight | fixed12 |\x1b[31m"
    with CheckpointWriter(tmp_path / "c", layout="fixed12") as w:
        w.add_tensor(evil, torch.arange(8))
        w.add_tensor("ok", torch.arange(8))
    assert main(["info", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\n| fake.weight" not in out and repr(evil) in out
    rows = out.split("\n\n")[0].splitlines()
    assert len(rows) == 4 and rows[2].startswith(repr(evil)) and rows[3].startswith("ok ")
