"""``glyd demo``, ``glyd fit`` and ``glyd eval`` (:mod:`glyd.apps.cli_models`): hostile arguments get one
line naming the argument, before any model is loaded."""

from __future__ import annotations

import pytest
import torch

from glyd.cli import main


@pytest.mark.parametrize("command", [["demo"], ["eval", "m"], ["serve", "m"]])
@pytest.mark.parametrize("device", ["bogus", "cuda:x", *([] if torch.cuda.is_available() else ["cuda"])])
def test_a_device_torch_cannot_use_is_an_argument_error(command, device, capsys):
    # it was a ValueError/RuntimeError traceback from the loader, after the command had started
    with pytest.raises(SystemExit) as info:
        main([*command, "--device", device])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"glyd {command[0]}: error: argument --device:") and repr(device) in err


@pytest.mark.parametrize("where", ["missing-folder", "a-file"])
def test_eval_json_out_in_a_folder_that_cannot_hold_it_fails_before_any_work(tmp_path, capsys, monkeypatch, where):
    # it was a FileNotFoundError traceback from the first mode's save, after that mode had run
    import glyd.apps.evaluate as evaluate

    monkeypatch.setattr(evaluate, "evaluate", lambda *a, **k: pytest.fail("evaluate ran"))
    parent = tmp_path / "nowhere"
    if where == "a-file":
        parent.write_text("")
    out = parent / "report.json"
    assert main(["eval", "qwen2.5-0.5b", "--random", "--device", "cpu", "--json-out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"glyd eval: error: {out}: ") and "not a folder" in err


def test_eval_json_out_that_cannot_be_written_is_one_line_and_leaves_no_temporary(tmp_path, capsys, monkeypatch):
    import glyd.apps.evaluate as evaluate

    import pathlib

    class Report:
        def to_json(self) -> str:
            return "{}"

    def full(self, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(evaluate, "evaluate", lambda cfg, on_result, progress: on_result(Report()))
    monkeypatch.setattr(pathlib.Path, "replace", full)  # the temporary is written, its rename fails
    out = tmp_path / "report.json"
    assert main(["eval", "qwen2.5-0.5b", "--random", "--device", "cpu", "--json-out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"glyd eval: error: {out}: No space left on device"
    assert list(tmp_path.iterdir()) == []
