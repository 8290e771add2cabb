"""The loader module a packed folder carries for transformers' ``auto_map`` (``glyd_loader.py``).

transformers reads no entry point; ``auto_map`` (run with ``trust_remote_code=True``) is its hook for
a config type it does not know, so ``transformers serve --trust-remote-code PACKED`` works in a
process that never imported glyd (tests/apps/test_serve_commands.py runs it).
"""

from __future__ import annotations

import json
import sys

import pytest
from store_helpers import make_model_folder

from glyd.store import CheckpointReader, pack_folder, unpack_folder
from glyd.store._config import LOADER_CLASS, LOADER_FILE, LOADER_SOURCE, packed_config, plain_config


def test_packed_folder_carries_the_loader_and_unpack_drops_it(tmp_path):
    make_model_folder(tmp_path / "src")
    pack_folder(tmp_path / "src", tmp_path / "packed", progress=False)
    cfg = json.loads((tmp_path / "packed" / "config.json").read_text())
    assert cfg["auto_map"] == {"AutoConfig": LOADER_CLASS} and cfg["model_type"] == "glyd"
    assert (tmp_path / "packed" / LOADER_FILE).read_text() == LOADER_SOURCE
    assert LOADER_FILE in CheckpointReader(tmp_path / "packed").files  # hashed in the manifest like every file
    unpack_folder(tmp_path / "packed", tmp_path / "plain", progress=False)
    assert not (tmp_path / "plain" / LOADER_FILE).exists()
    assert json.loads((tmp_path / "plain" / "config.json").read_text()) == {"model_type": "toy", "hidden_size": 40}


def test_a_stale_loader_in_the_source_is_replaced(tmp_path):
    make_model_folder(tmp_path / "src")
    (tmp_path / "src" / LOADER_FILE).write_text("raise SystemExit('an old loader')\n")
    pack_folder(tmp_path / "src", tmp_path / "packed", progress=False)
    assert (tmp_path / "packed" / LOADER_FILE).read_text() == LOADER_SOURCE
    CheckpointReader(tmp_path / "packed")  # the manifest's hash is the new file's


def test_a_models_own_auto_map_is_kept():
    own = {"model_type": "custom", "auto_map": {"AutoModelForCausalLM": "modeling_custom.Custom"}}
    cfg = packed_config(own, {"quant_method": "glyd"})
    assert cfg["auto_map"] == {"AutoModelForCausalLM": "modeling_custom.Custom", "AutoConfig": LOADER_CLASS}
    assert plain_config(cfg) == own
    theirs = {"model_type": "custom", "auto_map": {"AutoConfig": "configuration_custom.CustomConfig"}}
    assert packed_config(theirs, {"quant_method": "glyd"})["auto_map"] == theirs["auto_map"]  # not replaced


def test_the_loader_names_the_right_package_when_glyd_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "glyd.hf.packed_config", None)  # "import" raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'glyd-lossless\[models\]'"):
        exec(compile(LOADER_SOURCE, LOADER_FILE, "exec"), {})


def test_transformers_import_check_does_not_ask_for_the_wrong_package(tmp_path):
    dyn = pytest.importorskip("transformers.dynamic_module_utils")
    (tmp_path / LOADER_FILE).write_text(LOADER_SOURCE)
    # Imports inside try/except are not checked: a missing glyd reaches the loader's own message
    # instead of transformers' "pip install glyd" (the registry's "glyd" is another project).
    assert dyn.get_imports(tmp_path / LOADER_FILE) == []
