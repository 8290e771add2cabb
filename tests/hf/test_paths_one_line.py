"""glyd.from_pretrained names a folder whose path holds a line break quoted, on one line."""

from __future__ import annotations

import json

import pytest

import glyd
from glyd.errors import FormatError, GlydError

pytest.importorskip("transformers")


@pytest.fixture
def odd(tmp_path):
    path = tmp_path / "two\nlines"
    path.mkdir()
    return path


def _one_line(exc: BaseException, path) -> None:
    msg = str(exc)
    assert "\n" not in msg and repr(str(path)) in msg, msg


def test_a_folder_that_is_no_model_is_named_on_one_line(odd):
    (odd / "model.safetensors").write_bytes(b"")
    with pytest.raises(FormatError) as info:
        glyd.from_pretrained(odd, device="cpu", progress=False)  # no config.json
    _one_line(info.value, odd)


def test_a_packed_folder_with_a_bad_config_is_named_on_one_line(odd):
    from tiny_models import build_tiny_model

    src = build_tiny_model("llama", odd / "bf16")
    packed = odd / "packed"
    glyd.save_pretrained(glyd.from_pretrained(src, device="cpu", layout="fixed12", progress=False), packed)
    cfg = json.loads((packed / "config.json").read_text())
    (packed / "config.json").write_text(json.dumps({**cfg, "quantization_config": {**cfg["quantization_config"],
                                                                                    "layout": "nope"}}))
    with pytest.raises(GlydError) as info:
        glyd.from_pretrained(packed, device="cpu", progress=False)
    _one_line(info.value, packed / "config.json")


def test_loading_from_an_odd_folder_logs_it_on_one_line(tmp_path, caplog):
    # log lines print the folder quoted, as errors do: no line break, no escape reaches the terminal
    import logging

    from tiny_models import build_tiny_model

    odd = tmp_path / "two\nlines\x1b[2J"
    odd.mkdir()
    src = build_tiny_model("llama", odd / "bf16")
    packed = odd / "packed"
    with caplog.at_level(logging.DEBUG):
        glyd.save_pretrained(glyd.from_pretrained(src, device="cpu", layout="fixed12", merge=False, progress=False),
                             packed)
        glyd.from_pretrained(packed, device="cpu", merge=True, progress=False)
    said = [r.getMessage() for r in caplog.records if r.name.startswith("glyd")]
    assert any(repr(str(packed)) in m for m in said), said  # the folder is named, quoted
    assert all("\n" not in m and "\x1b" not in m for m in said), said
