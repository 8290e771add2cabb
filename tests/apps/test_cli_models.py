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


def _fake_eval(monkeypatch):
    """``evaluate`` replaced by one that saves one report (the temporary is written and renamed)."""
    import glyd.apps.evaluate as evaluate

    class Report:
        environment: dict = {}

        def to_json(self) -> str:
            return '{"results": []}'

        def table(self) -> str:
            return ""

    def fake(cfg, on_result, progress):
        on_result(Report())
        return Report()

    monkeypatch.setattr(evaluate, "evaluate", fake)


def test_eval_json_out_never_overwrites_a_file_beside_it(tmp_path, capsys, monkeypatch):
    # the report was written to OUT.tmp, then renamed: a file of that name was lost, and a link of
    # that name was written through (the file it pointed to overwritten with the report)
    _fake_eval(monkeypatch)
    (tmp_path / "report.json.tmp").write_text("precious")
    (tmp_path / "other.txt").write_text("other")
    (tmp_path / "r2.json.tmp").symlink_to(tmp_path / "other.txt")
    for name in ("report.json", "r2.json"):
        assert main(["eval", "qwen2.5-0.5b", "--random", "--device", "cpu", "--json-out", str(tmp_path / name)]) == 0
        assert (tmp_path / name).read_text() == '{"results": []}'
    assert (tmp_path / "report.json.tmp").read_text() == "precious"
    assert (tmp_path / "other.txt").read_text() == "other"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.txt", "r2.json", "r2.json.tmp", "report.json",
                                                         "report.json.tmp"]


def test_eval_json_out_onto_a_dangling_link_is_refused(tmp_path, capsys, monkeypatch):
    # Path.exists follows the link: the rename then replaced the link with the report
    _fake_eval(monkeypatch)
    out = tmp_path / "report.json"
    out.symlink_to(tmp_path / "gone.json")
    assert main(["eval", "qwen2.5-0.5b", "--random", "--device", "cpu", "--json-out", str(out)]) == 1
    assert capsys.readouterr().err.strip() == f"glyd eval: error: {out} exists; glyd never overwrites"
    assert out.is_symlink() and not (tmp_path / "gone.json").exists()
