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
