"""The commands' one-line errors stay one line for a path with a line break or an escape in it: the
path is printed quoted (``glyd.errors.show_path``)."""

from __future__ import annotations

import pytest

from glyd.cli import main


@pytest.fixture
def odd(tmp_path):
    path = tmp_path / "two\nlines\x1b[2J"
    path.mkdir()
    return path


@pytest.mark.parametrize("argv", [
    ["pack", "{odd}", "{tmp}/out"],          # a folder with no weights
    ["pack", "{odd}/missing", "{tmp}/out"],  # no such folder
    ["info", "{odd}"],                       # not a glyd checkpoint
    ["verify", "{odd}"],
    ["unpack", "{odd}", "{tmp}/out"],
    ["fit", "{odd}/missing", "--gpu", "80GB"],
])
def test_an_odd_path_is_quoted_in_a_one_line_error(odd, tmp_path, capsys, argv):
    argv = [a.format(odd=odd, tmp=tmp_path) for a in argv]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"glyd {argv[0]}: error: ") and "\x1b" not in err, err
    assert repr(str(odd))[:-1] in err, err  # the path as Python quotes it (the message may name a file inside)
