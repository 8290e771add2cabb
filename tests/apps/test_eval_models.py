"""``glyd.apps.eval_models``: merged products equal the separate ones, and each group's separate
weights are freed as it is merged (the peak is one group's copy, not every group's); a model folder's
config.json or a --random config that cannot be read or built is one error line."""

from __future__ import annotations

import gc
import json
import re
import weakref

import pytest
import torch

from glyd.apps import eval_models


def _tiny_llama(layers: int = 3):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()


def test_merged_products_equal_the_separate_ones():
    model = _tiny_llama()
    ids = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        ref = model(ids).logits
        assert eval_models.merge_bf16(model) == 6  # q|k|v and gate|up in each of 3 layers
        got = model(ids).logits
    assert torch.equal(got.float(), ref.float()) or (got.float() - ref.float()).abs().max() < 2e-2


def test_each_groups_weights_are_freed_as_it_is_merged(monkeypatch):
    model = _tiny_llama()
    alive: list[weakref.ref] = []
    seen_alive = []
    real = eval_models._MergedLinear.__init__

    def init(self, linears):
        gc.collect()
        seen_alive.append(sum(r() is not None for r in alive))  # earlier groups' originals still alive
        alive.extend(weakref.ref(lin.weight) for lin in linears)
        real(self, linears)

    monkeypatch.setattr(eval_models._MergedLinear, "__init__", init)
    eval_models.merge_bf16(model)
    # before the fix every original stayed alive until merge_bf16 returned: [0, 3, 5, 8, 10, 13]
    assert len(seen_alive) == 6 and max(seen_alive) <= 3, seen_alive


@pytest.mark.parametrize("text, says", [
    ("[" * 100_000 + "]" * 100_000, "not valid JSON (nested too deeply)"),
    ("{", "not valid JSON (Expecting property name"),
    ("[1]", "not a JSON object"),
    ("\udcff", "not valid JSON ('utf-8' codec can't decode byte 0xff"),
])
def test_a_config_json_glyd_cannot_read_is_one_line(tmp_path, capsys, text, says):
    # check_model_folder read it with json.loads and let transformers "report" it: RecursionError,
    # OSError and TypeError tracebacks out of glyd eval
    from glyd.cli import main

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    assert main(["eval", str(folder), "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"glyd eval: error: {folder / 'config.json'}: {says}") and "\n" not in err, err


BASE = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}


@pytest.mark.parametrize("edit, says", [
    ({"model_type": "nosuch"}, "transformers .* does not know model_type 'nosuch'"),
    ({"num_hidden_layers": 10**9}, "num_hidden_layers 1000000000 is not between 0 and 4096"),
    ({"hidden_size": -64}, r"transformers cannot build a causal LM from this llama config \(Trying to create tensor "
                           "with negative dimension"),
    ({"num_attention_heads": 0}, r"transformers cannot read this llama config \(integer division or modulo by zero\)"),
    ({"vocab_size": "x"}, "transformers cannot read this llama config \\(Validation error for field 'vocab_size'"),
    ({"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
])
def test_a_random_config_transformers_cannot_build_is_one_line(tmp_path, capsys, edit, says):
    # glyd eval CONFIG --random: ValueError, RuntimeError, ZeroDivisionError and StrictDataclassFieldValidationError
    # tracebacks, and 10**9 layers built until memory ran out
    from glyd.cli import main

    def budget(module, name, sub):  # a build of 10**9 layers stops here, not when memory runs out
        built.append(name)
        if len(built) > 5000:
            raise MemoryError("more than 5,000 modules built")

    built: list[str] = []
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**BASE, **edit}))
    handle = torch.nn.modules.module.register_module_module_registration_hook(budget)
    try:
        assert main(["eval", str(path), "--random", "--device", "cpu", "--modes", "fixed12", "--decode-batches", "1",
                     "--decode-context", "8", "--decode-replays", "1"]) == 1
    finally:
        handle.remove()
    err = capsys.readouterr().err.strip()
    assert re.fullmatch(f"glyd eval: error: {re.escape(str(path))}: {says}.*", err), err
