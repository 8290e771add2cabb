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


def _glyd_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("glyd")]


@pytest.mark.parametrize("case", ["no config.json", "transformers missing", "a tensor with no place"])
def test_glyd_pack_logs_an_odd_path_on_one_line(odd, tmp_path, caplog, monkeypatch, case):
    # a log line, like an error, prints the folder quoted: no line break, no escape reaches the terminal
    import logging
    import sys
    from pathlib import Path

    import torch
    from safetensors.torch import load_file, save_file

    if case == "no config.json":
        src = odd / "raw"
        src.mkdir()
        save_file({"w": torch.ones(8, 8, dtype=torch.bfloat16)}, str(src / "model.safetensors"))
    else:
        pytest.importorskip("transformers")
        sys.path.insert(0, str(Path(__file__).parent))
        from serve_model import build_chat_model

        src = build_chat_model(odd / "bf16")
        if case == "transformers missing":
            from glyd.hf import pack_plan

            def no_transformers(*args):
                raise ModuleNotFoundError("No module named 'transformers'", name="transformers")

            monkeypatch.setattr(pack_plan, "_meta_model", no_transformers)
        else:
            tensors = load_file(str(src / "model.safetensors"))
            tensors["model.position_ids"] = torch.arange(8)[None].to(torch.bfloat16)
            save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    with caplog.at_level(logging.DEBUG):
        assert main(["-q", "pack", str(src), str(tmp_path / "packed")]) == 0
    said = _glyd_lines(caplog)
    assert any(repr(str(src)) in m for m in said), said  # the folder is named, quoted
    assert all("\n" not in m and "\x1b" not in m for m in said), said


#: Every path argument of every command (positional or an option), each given as "".
EMPTY_PATHS = [
    ["info", ""], ["verify", ""], ["pack", "", "out"], ["pack", "src", ""], ["unpack", "", "out"],
    ["unpack", "src", ""],
    ["fit", "", "--gpu", "80GB"], ["eval", ""], ["eval", "m", "--text", ""], ["eval", "m", "--mmlu-dir", ""],
    ["eval", "m", "--json-out", ""], ["demo", "--model", ""], ["demo", "--out", ""], ["serve", ""],
    ["compress", ""], ["compress", "a", ""], ["compress", "a", "-o", ""], ["decompress", ""],
    ["decompress", "a.glyd", "-o", ""], ["test", ""],
]


@pytest.mark.parametrize("argv", EMPTY_PATHS, ids=" ".join)
def test_an_empty_path_is_refused_while_parsing(tmp_path, capsys, monkeypatch, argv):
    # `glyd info ""` read the folder it ran in (Path("") is "."): "glyd info: error: .: not a glyd packed
    # checkpoint (no glyd.json)", or listed that folder's checkpoint as the one asked for
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and err[-1].startswith(f"glyd {argv[0]}: error: argument ") and \
        err[-1].endswith(": an empty path: name a file or folder ('.' for the current folder)"), err


def test_every_path_argument_refuses_an_empty_path():
    # a path argument added later takes the same check: every argument whose help or name says it is a
    # folder, a file or an archive (not a choice, a number or a flag) parses with path_arg
    import argparse

    from glyd.apps.cli_models import path_arg
    from glyd.cli import build_parser

    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    words = ("folder", "file", "archive", "path", "model")
    for name, sub in subs.choices.items():
        for action in sub._actions:
            said = f"{action.dest} {action.metavar or ''} {action.help or ''}".lower()
            if action.nargs == 0 or action.choices or action.type not in (None, path_arg):
                continue
            if any(w in said for w in words) and action.dest not in ("name", "prompt"):
                assert action.type is path_arg, f"glyd {name} {action.option_strings or action.dest}"
