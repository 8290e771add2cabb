"""Hostile packed model folders through every loader: glyd.from_pretrained (verify=False and
True), native transformers loading, and the store's readers (tests/store/fuzz_readers.py).

A loader must raise one clear glyd error, or return the packed model bit for bit (every tensor
of its state_dict, and its config). Documented exceptions, and only these: without verify
(``verify=False``, native loading) a change of bytes inside the stored arrays' data loads
silently (docs/models.md, "What only verify=True detects"), and an edited config.json loads
with a warning; natively, transformers parses config.json and the index before glyd runs, so a
file it cannot parse gets transformers' own error, and a config.json that no longer names glyd's
quantizer is loaded by transformers alone, without glyd (``foreign``: its load report lists the
packed arrays as unexpected and the weights as missing; docs/models.md, "What loading checks").
"""

from __future__ import annotations

import json
import random
import sys
import traceback
from pathlib import Path

import pytest
import torch

import glyd

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM  # noqa: E402

# The mutations and the store readers' rules are shared with tests/store/test_store_fuzz.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))
import fuzz_cases as fc  # noqa: E402
from fuzz_readers import (  # noqa: E402
    STORE_READERS, Judge, Outcome, check_campaign, judge_error, pristine, run_cases, signature,
)

GLYD_SRC = Path(glyd.__file__).resolve().parent
CONFIG = "config.json"
LOADERS = ("load", "load verify", "native")


def _load(loader: str, folder: Path):
    if loader == "native":
        return AutoModelForCausalLM.from_pretrained(folder)
    return glyd.from_pretrained(folder, device="cpu", verify=loader == "load verify", progress=False)


def model_bits(model) -> tuple[dict, dict, dict]:
    """(state_dict signatures, config, generation config) of a loaded model."""
    tensors = {k: signature(v) for k, v in model.state_dict().items()}
    cfg = {k: v for k, v in model.config.to_dict().items() if not k.startswith("_")}
    gen = model.generation_config.to_dict() if model.generation_config is not None else {}
    return tensors, cfg, {k: v for k, v in gen.items() if not k.startswith("_")}


def _transformers_own(exc: BaseException) -> bool:
    """Raised by transformers before any glyd code ran (no frame of glyd in the traceback but
    glyd's config type ``glyd``, which hands the dict on to transformers' own config class)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return not any(Path(f.filename).resolve().is_relative_to(GLYD_SRC) and Path(f.filename).name != "packed_config.py"
                   for f in frames)


def _not_glyds(folder: Path) -> bool:
    """Whether config.json no longer names glyd's quantizer (transformers then never calls glyd)."""
    try:
        q = json.loads((folder / CONFIG).read_text()).get("quantization_config")
    except (OSError, ValueError, AttributeError):
        return False
    return not (isinstance(q, dict) and q.get("quant_method") == "glyd")


def _native_error(case: fc.Case, exc: Exception, kind: str, detail: str) -> tuple[str, str]:
    """Natively, transformers reads config.json and the index before glyd runs: its own error
    for a file it cannot parse, and glyd's config checks, which cannot know the folder, name
    the field."""
    if kind != "defect" or case.touches not in (CONFIG, fc.INDEX):
        return kind, detail
    if _transformers_own(exc):
        return "error", f"transformers' own ({type(exc).__name__}: {str(exc)[:200]})"
    msg = str(exc)
    if isinstance(exc, glyd.GlydError) and "\n" not in msg and msg.startswith("quantization_config."):
        return "error", f"{type(exc).__name__}: {msg[:200]}"
    return kind, detail


def judge_loaders(judge: Judge, base: tuple[dict, dict, dict]) -> None:
    case = judge.case
    for loader in LOADERS:
        seen = len(judge.warnings)
        try:
            model = _load(loader, judge.folder)
        except Exception as exc:
            kind, detail = judge_error(exc, judge.folder)
            if loader == "native":
                kind, detail = _native_error(case, exc, kind, detail)
            judge.add(loader, kind, detail)
            continue
        tensors, cfg, gen = model_bits(model)
        del model
        verified = loader == "load verify"
        warned = any("differs from the config.json recorded" in w for w in judge.warnings[seen:])
        if tensors != base[0]:
            bad = sorted(k for k in tensors.keys() | base[0].keys() if tensors.get(k) != base[0].get(k))
            if loader == "native" and _not_glyds(judge.folder):
                judge.add(loader, "foreign", f"transformers loaded it without glyd (its own load report): {bad[:4]}")
                continue
            ok = case.data_only and not verified
            judge.add(loader, "silent" if ok else "defect", f"other tensors: {bad[:4]}")
        elif cfg != base[1]:
            bad = sorted(k for k in cfg.keys() | base[1].keys() if cfg.get(k) != base[1].get(k))
            ok = warned and not verified
            judge.add(loader, "warned" if ok else "defect", f"other config (warned: {warned}): {bad[:4]}")
        elif verified and gen != base[2]:
            judge.add(loader, "defect", "verify=True loaded another generation config")
        else:
            judge.add(loader, "same")


#: Packed tiny models: name -> (family, layout, shard size): a tied Llama in 4 shards with an
#: index (the default run), an untied Qwen2 with biases in one tiered shard (the slow sweep), a
#: Mixtral with 4 experts a layer in one tiered shard (its experts' cases, the default run).
MODELS = {"llama-fixed12": ("llama", "fixed12", 40_000), "qwen2-tiered": ("qwen2", "tiered", 2**30),
          "mixtral-tiered": ("mixtral", "tiered", 2**30)}


@pytest.fixture(scope="module")
def packed_model(tiny_model_folder, tmp_path_factory):
    """``packed_model(name)`` -> (folder, what the store readers give, what every loader gives)."""
    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache:
            family, layout, shard = MODELS[name]
            model = glyd.from_pretrained(tiny_model_folder(family), layout=layout, device="cpu", progress=False)
            root = tmp_path_factory.mktemp(f"fuzz-{name}")
            out = glyd.save_pretrained(model, root / "glyd", max_shard_bytes=shard, progress=False)
            assert (out / "tokenizer_config.json").is_file() and (out / fc.INDEX).is_file() == (shard < 2**30)
            base = model_bits(_load("load verify", out))
            assert base[0] == model_bits(model)[0], "the folder does not load the model that was saved"
            for loader in LOADERS:
                assert model_bits(_load(loader, out)) == base, loader
            cache[name] = out, pristine(out, root), base
        return cache[name]

    return get


def _both(*edits):
    def edit(doc):
        for e in edits:
            e(doc)
    return edit


def _own_type(cfg: dict) -> str:
    return cfg["quantization_config"]["original_model_type"]


def config_cases(cfg: dict) -> list[fc.Case]:
    """config.json edits a model notices (an architecture it cannot fill) or may not (an epsilon)."""
    q = ("quantization_config",)
    edits = {
        "quantization_config removed": fc.set_at(q, fc.MISSING),
        # A folder of the earlier convention (the model's own model_type) that lost its quantization_config.
        "quantization_config removed, own model_type": _both(fc.set_at(q, fc.MISSING),
                                                             fc.set_at(("model_type",), _own_type(cfg))),
        "quant_method gptq": fc.set_at((*q, "quant_method"), "gptq"),
        "quant_method removed": fc.set_at((*q, "quant_method"), fc.MISSING),
        "layout tiered": fc.set_at((*q, "layout"), "tiered"),
        "layout removed": fc.set_at((*q, "layout"), fc.MISSING),
        "layout a list": fc.set_at((*q, "layout"), ["fixed12"]),
        "format_version 2": fc.set_at((*q, "format_version"), 2),
        "format_version '1'": fc.set_at((*q, "format_version"), "1"),
        "merged claimed": fc.set_at((*q, "merged"), {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}),
        "merged garbage": fc.set_at((*q, "merged"), {"qkv_proj": "q_proj"}),
        "exact true": fc.set_at((*q, "exact"), True),
        "quantization_config a string": fc.set_at(q, "glyd"),
        "num_hidden_layers +1": fc.set_at(("num_hidden_layers",), cfg["num_hidden_layers"] + 1),
        "num_hidden_layers -1": fc.set_at(("num_hidden_layers",), cfg["num_hidden_layers"] - 1),
        "vocab_size +1": fc.set_at(("vocab_size",), cfg["vocab_size"] + 1),
        "intermediate_size x2": fc.set_at(("intermediate_size",), cfg["intermediate_size"] * 2),
        "tie_word_embeddings false": fc.set_at(("tie_word_embeddings",), False),
        "model_type mistral": fc.set_at(("model_type",), "mistral"),
        "model_type unknown": fc.set_at(("model_type",), "no-such-model"),
        "architectures Mistral": fc.set_at(("architectures",), ["MistralForCausalLM"]),
        "dtype float32": fc.set_at(("dtype",), "float32"),
        "rms_norm_eps 1e-3": fc.set_at(("rms_norm_eps",), 1e-3),
        "max_position_embeddings 512": fc.set_at(("max_position_embeddings",), 512),
        "hidden_act gelu": fc.set_at(("hidden_act",), "gelu"),
        "hidden_act unknown": fc.set_at(("hidden_act",), "no-such-act"),
        "num_attention_heads 3": fc.set_at(("num_attention_heads",), 3),
        "num_key_value_heads 3": fc.set_at(("num_key_value_heads",), 3),
        "head_dim 7": fc.set_at(("head_dim",), 7),
        "hidden_size 0": fc.set_at(("hidden_size",), 0),
        "vocab_size -1": fc.set_at(("vocab_size",), -1),
        "rope_scaling bogus": fc.set_at(("rope_scaling",), {"rope_type": "no-such-rope"}),
        "dtype int7": fc.set_at(("dtype",), "int7"),
        "architectures unknown": fc.set_at(("architectures",), ["NoSuchModelForCausalLM"]),
        "model_type null": fc.set_at(("model_type",), None),
        # Counts transformers builds modules or tables from, past what the checkpoint holds: built
        # until memory ran out (10 GB and growing), before any check (issue 33).
        "num_hidden_layers 10**30": fc.set_at(("num_hidden_layers",), 10**30),
        "num_hidden_layers 10**5": fc.set_at(("num_hidden_layers",), 10**5),
        "num_labels 10**30": fc.set_at(("num_labels",), 10**30),
        "text_config claims 10**30 layers": fc.set_at(("text_config",), {"num_hidden_layers": 10**30}),
        "original_model_type removed": fc.set_at((*q, "original_model_type"), fc.MISSING),
        "original_model_type 5": fc.set_at((*q, "original_model_type"), 5),
        "a field 70 lists deep": fc.set_at(("deep",), fc.Raw("[" * 70 + "]" * 70)),
        "a field 100,000 lists deep": fc.set_at(("deep",), fc.Raw("[" * 100_000 + "]" * 100_000)),
    }
    return [fc.Case(f"config.json: {what}", fc.json_edit(CONFIG, e), CONFIG, family="config") for what, e in edits.items()]


#: How many cases of each family the default run takes (seeded samples); the slow sweep takes all.
SAMPLE = {"manifest": 40, "header": 24, "link": 12, "added": 8}


def model_cases(folder: Path, seed: int, full: bool) -> dict[str, list[fc.Case]]:
    rng = random.Random(seed)
    m = json.loads((folder / fc.MANIFEST).read_text())
    fam = {
        "bytes": fc.byte_cases(folder, seed, flips=12 if full else 3, truncations=6 if full else 2,
                               appends=fc.APPENDS if full else (b" ",)),
        "manifest": fc.manifest_cases(m, seed) + fc.text_cases(fc.MANIFEST)
        + (fc.index_cases(json.loads((folder / fc.INDEX).read_text()), seed) if (folder / fc.INDEX).exists() else []),
        "header": fc.header_cases(folder, seed, full=full),
        "config": config_cases(json.loads((folder / CONFIG).read_text())) + fc.text_cases(CONFIG),
        "link": fc.link_cases(folder),
        "added": fc.added_file_cases(folder),
    }
    if not full:
        for k, n in SAMPLE.items():
            keep = [c for c in fam[k] if c.family == "swap"]  # every offset swap: the silent-swap candidates
            fam[k] = keep + rng.sample([c for c in fam[k] if c not in keep], n - len(keep))
    return fam


def _run(packed_model, name: str, tmp_path, full: bool) -> tuple[Path, dict[str, list[fc.Case]], list[Outcome]]:
    folder, store_base, model_base = packed_model(name)
    fam = model_cases(folder, seed=11, full=full)
    cases = [c for f in fam.values() for c in f]
    outcomes = run_cases(cases, folder, store_base, tmp_path, extra=lambda j: judge_loaders(j, model_base))
    return folder, fam, outcomes


def _check(fam: dict[str, list[fc.Case]], outcomes: list[Outcome]) -> dict[str, int]:
    return check_campaign([c for f in fam.values() for c in f], outcomes, STORE_READERS | set(LOADERS))


def test_hostile_model_folders(packed_model, tmp_path):
    folder, fam, outcomes = _run(packed_model, "llama-fixed12", tmp_path, full=False)
    shards = [f for f in fc.folder_files(folder) if f.endswith(".safetensors")]
    others = len(fc.folder_files(folder)) - len(shards)
    assert len(fam["bytes"]) == len(shards) * (3 * 3 + 2 + 1) + others * (3 + 2 + 1)
    assert {k: len(fam[k]) for k in SAMPLE} == SAMPLE
    assert len(fam["config"]) == 35 + 8 + 12 and any(c.family == "swap" for c in fam["header"])
    counts = _check(fam, outcomes)
    # The documented silences happened, and only on data flips: every data flip reached a model.
    data = [c.id for c in fam["bytes"] if c.data_only]
    silent = {o.case for o in outcomes if o.kind == "silent"}
    assert silent and silent <= set(data) and counts["error"] and counts["same"]
    loads = {o.case: o.kind for o in outcomes if o.reader == "load verify"}
    assert all(loads[c] == "error" for c in silent), "verify=True must refuse what verify=False loads silently"
    # Only a config.json that lost both model_type "glyd" and quantization_config is transformers'
    # alone; with model_type "glyd" and no quantization_config, every loader refuses it.
    assert counts["foreign"] == sum(c.id == "config.json: quantization_config removed, own model_type"
                                    for c in fam["config"]) == 1
    # Issue 33's configs: every loader refuses each (none loads, none silently, none runs away).
    late = [c.id for c in fam["config"][35:43]]
    assert len(late) == 8 and all("10**" in c or "original_model_type" in c or "deep" in c for c in late)
    kinds = {(o.case, o.reader): o.kind for o in outcomes if o.case in late and o.reader in LOADERS}
    assert len(kinds) == 8 * len(LOADERS) and set(kinds.values()) == {"error"}, kinds


@pytest.mark.slow
@pytest.mark.parametrize("name, full", [("llama-fixed12", True), ("qwen2-tiered", False)])
def test_hostile_model_folders_sweep(packed_model, tmp_path, name, full):
    _, fam, outcomes = _run(packed_model, name, tmp_path, full=full)
    _check(fam, outcomes)


def moe_cases(folder: Path, seed: int) -> list[fc.Case]:
    """What reaches a Mixtral's packed experts: every shape and a sample of the other fields of one
    layer's experts entries and their arrays in glyd.json, a sample of their shard-header edits, and
    config.json's experts counts (issue 36)."""
    rng = random.Random(seed)
    m = json.loads((folder / fc.MANIFEST).read_text())
    experts = [n for n in m["tensors"] if n.startswith("model.layers.1.mlp.experts.")]
    fields = [c for c in fc.manifest_cases({**m, "tensors": {n: m["tensors"][n] for n in experts}}, seed, full=True)
              if c.family in ("entry", "array")]
    shapes = [c for c in fields if c.field and c.field[2:] == ("shape",)]  # the entries' own, not their arrays'
    header = [c for c in fc.header_cases(folder, seed, full=True) if "experts" in c.id]
    cfg = json.loads((folder / CONFIG).read_text())
    edits = {"num_local_experts +1": ("num_local_experts", 5), "num_local_experts 0": ("num_local_experts", 0),
             "num_experts_per_tok 0": ("num_experts_per_tok", 0), "num_experts_per_tok 5": ("num_experts_per_tok", 5),
             "num_experts_per_tok -1": ("num_experts_per_tok", -1)}
    assert cfg["num_local_experts"] == 4 and cfg["num_experts_per_tok"] == 2
    config = [fc.Case(f"config.json: {what}", fc.json_edit(CONFIG, fc.set_at((k,), v)), CONFIG, family="config")
              for what, (k, v) in edits.items()]
    return shapes + rng.sample([c for c in fields if c not in shapes], 24) + rng.sample(header, 16) + config


def test_hostile_moe_folders(packed_model, tmp_path):
    # glyd info listed an experts shape its arrays contradict ([4, 191, 64]) without an error, and a
    # config routing to 0 or 5 of 4 experts loaded (with a warning) into a model that adds nothing
    # in its MoE blocks, or fails at its first forward; the campaign could not be made (the shape
    # cases assumed 2-D shapes)
    folder, store_base, model_base = packed_model("mixtral-tiered")
    cases = moe_cases(folder, seed=5)
    outcomes = run_cases(cases, folder, store_base, tmp_path, extra=lambda j: judge_loaders(j, model_base))
    counts = check_campaign(cases, outcomes, STORE_READERS | set(LOADERS))
    assert counts["error"] and counts["same"]
    kinds = {(o.case, o.reader): o.kind for o in outcomes}
    shapes = [c.id for c in cases if c.field and c.field[2:] == ("shape",) and not c.unverified_ok]
    assert len(shapes) > 20 and all(kinds[c, "info"] == "error" for c in shapes)
    for c in [c.id for c in cases if "num_experts_per_tok" in c.id]:
        assert all(kinds[c, r] == "error" for r in LOADERS), c
