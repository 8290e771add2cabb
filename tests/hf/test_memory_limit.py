"""``memory_limit``: the layout chosen (``layout="auto"``) or checked (an explicit one) before packing,
counted as ``glyd fit`` counts (glyd.hf.memory); without a limit, ``auto`` chooses per matrix as before."""

from __future__ import annotations

import dataclasses
import logging
import shutil

import pytest
import torch

import glyd
from glyd import ops as _ops
from glyd.errors import GlydError
from glyd.hf.memory import SPEED_ORDER, WeightsCount, fit_layout, parse_memory
from glyd.nn import GlydEmbedding, GlydLinear
from glyd.store._safetensors import read_header

transformers = pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM  # noqa: E402

LOG = "glyd.hf.memory"


def layouts_of(model) -> set[str]:
    return {m.packed.layout for m in model.modules() if isinstance(m, (GlydLinear, GlydEmbedding))}


def count_of(folder) -> WeightsCount:
    return WeightsCount.of(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16))


@pytest.fixture
def packs(monkeypatch):
    """Every matrix packed (glyd.ops._pack: every packing path of a dense model goes through it)."""
    calls = []
    real = _ops._pack

    def spy(w, layout):
        calls.append(layout)
        return real(w, layout)

    monkeypatch.setattr(_ops, "_pack", spy)
    return calls


# -- parsing -----------------------------------------------------------------------------------------


def test_memory_limit_reads_bytes_and_sizes_with_their_unit():
    assert parse_memory(123) == 123
    assert parse_memory("40GB") == 40 * 10**9
    assert parse_memory("40GiB") == parse_memory("40 gib") == 40 * 2**30
    assert parse_memory("1.5MiB") == 3 * 2**19
    assert parse_memory("2TB") == 2 * 10**12
    assert parse_memory("1000B") == parse_memory("1000 b") == 1000  # bytes with their unit: the command line's only way


@pytest.mark.parametrize("bad,why", [
    ("40", "with its unit"),  # a bare number is ambiguous (GiB for glyd fit --gpu, bytes as an int)
    ("lots", "with its unit"),
    ("40 GBs", "with its unit"),
    ("-1GB", "with its unit"),
    ("0GB", "positive"),
    (0, "positive"),
    (-5, "positive"),
    (2**61, "at most 2"),
    (1.5e9, "an int"),
    (True, "an int"),
    (None, "an int"),
])
def test_a_bad_memory_limit_gets_one_line(bad, why):
    with pytest.raises(GlydError, match=why) as e:
        parse_memory(bad)
    assert "\n" not in str(e.value) and "memory_limit" in str(e.value)


def test_an_integer_of_another_type_is_bytes():
    # numpy's ints (a size computed with numpy) were refused with "memory_limit=1000000000: give bytes (an int)"
    np = pytest.importorskip("numpy")
    assert parse_memory(np.int64(10**9)) == 10**9 and type(parse_memory(np.uint32(5))) is int
    with pytest.raises(GlydError, match="an int"):
        parse_memory(np.bool_(True))
    with pytest.raises(GlydError, match="positive"):
        parse_memory(np.int64(0))


@pytest.mark.parametrize("what", ["memory_limit", "--memory-limit"])
def test_a_line_break_in_the_value_stays_out_of_the_one_line_message(what):
    class Odd:  # an object whose str spans lines
        def __str__(self):
            return "a\nb"

    for bad in ["1\n0GB", "10GB\x1b[2J", Odd()]:
        with pytest.raises(GlydError) as e:
            parse_memory(bad, what)
        assert str(e.value).isprintable(), repr(str(e.value))


def test_a_number_of_thousands_of_digits_is_read_not_crashed_on():
    # Python refuses int(str) past 4300 digits: a raw ValueError, not glyd's one line
    with pytest.raises(GlydError, match="at most 2"):
        parse_memory("1" * 5000 + "GB")
    with pytest.raises(GlydError, match="positive"):
        parse_memory("0." + "0" * 5000 + "1GB")
    assert parse_memory("0" * 5000 + "1.5KiB") == 1536


def test_a_long_bad_string_is_cut_in_the_message():
    with pytest.raises(GlydError) as e:
        parse_memory("x" * 5000)
    assert len(str(e.value)) < 300


# -- the choice --------------------------------------------------------------------------------------


COUNT = WeightsCount(packable=8 * 2**30, other_bytes=3 * 2**20)


def test_speed_order_is_every_built_in_layout_and_smaller_is_slower():
    assert set(SPEED_ORDER) == set(glyd.LAYOUTS)
    needs = [COUNT.need(name) for name in SPEED_ORDER]
    assert needs == sorted(needs, reverse=True)


@pytest.mark.parametrize("i", range(len(SPEED_ORDER)))
def test_auto_takes_the_fastest_layout_that_fits(i, caplog):
    name = SPEED_ORDER[i]
    need = COUNT.need(name)
    with caplog.at_level(logging.INFO, logger=LOG):
        assert fit_layout(COUNT, "auto", need) == name  # exactly its need: it fits
    line = [r.getMessage() for r in caplog.records if r.name == LOG]
    assert len(line) == 1 and line[0].startswith(f"layout auto: {name} (")
    for slower in SPEED_ORDER[:i]:  # why not a faster one: its need is said
        assert f"{slower} needs {COUNT.need(slower) / 2**30:.2f} GiB" in line[0]
    if i + 1 < len(SPEED_ORDER):
        assert fit_layout(COUNT, "auto", need - 1) == SPEED_ORDER[i + 1]  # a byte less: the next one


def test_the_log_line_says_the_weights_and_the_limit(caplog):
    with caplog.at_level(logging.INFO, logger=LOG):
        fit_layout(COUNT, "auto", 40 * 2**30)
    assert [r.getMessage() for r in caplog.records if r.name == LOG] == [
        "layout auto: fixed12 (weights 12.05 GiB fit the 40.00 GiB allowed)"]


def test_nothing_fits_names_the_smallest_need_and_the_limit():
    smallest = min(SPEED_ORDER, key=COUNT.need)
    with pytest.raises(GlydError, match=rf"memory_limit 10.00 GiB: no layout fits.*{smallest}, needs "
                       rf"{COUNT.need(smallest) / 2**30:.2f} GiB") as e:
        fit_layout(COUNT, "auto", 10 * 2**30)
    assert "\n" not in str(e.value)


def test_an_explicit_layout_over_the_limit_is_refused_and_told_what_fits():
    limit = COUNT.need("dense11")
    assert fit_layout(COUNT, "dense11", limit) == "dense11"
    with pytest.raises(GlydError, match=r"layout fixed12: its weights need 12.05 GiB, memory_limit allows "
                       r".*dense11 needs"):
        fit_layout(COUNT, "fixed12", limit)
    with pytest.raises(GlydError, match="layout tiered"):
        fit_layout(COUNT, "tiered", COUNT.need("tiered") - 1)


# -- from_pretrained and compress ------------------------------------------------------------------


@pytest.mark.parametrize("family", ["qwen2", "llama"])  # untied (and biases), tied embeddings
def test_the_count_is_glyd_fits(tiny_model_folder, family):
    from glyd.apps.fit import run_fit

    src = tiny_model_folder(family)
    count = count_of(src)
    for name in SPEED_ORDER:
        e, _ = run_fit(str(src), "80GB", context=16, layout=name)
        assert e.weights_glyd == count.need(name), name


def test_from_pretrained_packs_the_fastest_layout_that_fits(tiny_model_folder, packs, caplog):
    src = tiny_model_folder("qwen2")
    count = count_of(src)
    want = {count.need("fixed12"): "fixed12", count.need("fixed12") - 1: "dense11",
            count.need("dense11"): "dense11", count.need("dense11") - 1: "tiered", count.need("tiered"): "tiered"}
    for limit, name in want.items():
        packs.clear()
        with caplog.at_level(logging.INFO, logger=LOG):
            model = glyd.from_pretrained(src, device="cpu", memory_limit=limit, progress=False)
        assert layouts_of(model) == {name} and set(packs) == {name}, limit
        assert f"layout auto: {name} (" in caplog.text


def test_from_pretrained_refuses_before_packing(tiny_model_folder, packs):
    src = tiny_model_folder("qwen2")
    count = count_of(src)
    with pytest.raises(GlydError, match="no layout fits.*tiered"):
        glyd.from_pretrained(src, device="cpu", memory_limit=count.need("tiered") - 1, progress=False)
    with pytest.raises(GlydError, match="layout fixed12: its weights need.*nothing was packed"):
        glyd.from_pretrained(src, layout="fixed12", device="cpu", memory_limit=count.need("fixed12") - 1,
                             progress=False)
    with pytest.raises(GlydError, match="with its unit"):
        glyd.from_pretrained(src, device="cpu", memory_limit="40", progress=False)
    assert packs == []


def test_from_pretrained_keeps_an_explicit_layout_that_fits(tiny_model_folder):
    src = tiny_model_folder("qwen2")
    model = glyd.from_pretrained(src, layout="tiered", device="cpu", memory_limit="1GiB", progress=False)
    assert layouts_of(model) == {"tiered"}


def test_without_a_limit_auto_still_chooses_per_matrix(tiny_model_folder, monkeypatch):
    src = tiny_model_folder("qwen2")
    asked = []

    def choose(shape, device=None):  # a GPU table's choice: tiered for the wide matrices only
        asked.append(tuple(shape))
        return "tiered" if shape[0] > 64 else "fixed12"

    monkeypatch.setattr(_ops, "choose_layout", choose)
    model = glyd.from_pretrained(src, device="cpu", progress=False)
    assert asked and layouts_of(model) == {"tiered", "fixed12"}
    asked.clear()
    model = glyd.from_pretrained(src, device="cpu", memory_limit="1GiB", progress=False)
    assert asked == [] and layouts_of(model) == {"fixed12"}  # a limit: one layout, the fastest that fits


def test_compress_takes_a_limit(tiny_model_folder, packs):
    src = tiny_model_folder("llama")
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    count = WeightsCount.of(model)
    with pytest.raises(GlydError, match="layout fixed12"):
        glyd.compress(model, layout="fixed12", memory_limit=count.need("fixed12") - 1, progress=False)
    assert packs == [] and layouts_of(model) == set()
    glyd.compress(model, memory_limit=count.need("fixed12") - 1, progress=False)
    assert layouts_of(model) == {"dense11"}


def test_a_glyd_folder_is_checked_as_stored(tiny_model_folder, tmp_path):
    src = tiny_model_folder("llama")
    out = tmp_path / "packed"
    glyd.save_pretrained(glyd.from_pretrained(src, layout="fixed12", device="cpu", progress=False), out)
    stored = sum(i.end - i.begin for f in out.glob("*.safetensors") for i in read_header(f).tensors.values())
    with pytest.raises(GlydError, match="as stored, memory_limit allows.*keeps the layout"):
        glyd.from_pretrained(out, device="cpu", memory_limit=stored - 1, progress=False)
    model = glyd.from_pretrained(out, device="cpu", memory_limit=stored, progress=False)
    assert layouts_of(model) == {"fixed12"}


def test_packed_bytes_past_the_limit_are_warned(tiny_model_folder, caplog, monkeypatch):
    # A plan under what the packed model takes (dense11 planned without its per-row tables, as before
    # Layout.row_bytes: 2.25 bytes a row of 64 weights here): the count said dense11 fits exactly, the
    # packed model passes it, and a WARNING says so after packing. With the tables counted it fits.
    src = tiny_model_folder("qwen2")
    planned = count_of(src).need("dense11")
    monkeypatch.setitem(glyd.LAYOUTS, "dense11", dataclasses.replace(glyd.LAYOUTS["dense11"], row_bytes=None))
    count = count_of(src)
    assert count.need("dense11") < planned
    with caplog.at_level(logging.INFO, logger=LOG):
        model = glyd.from_pretrained(src, layout="dense11", device="cpu", memory_limit=count.need("dense11"),
                                     progress=False)
    packed = sum(m.packed.nbytes for m in model.modules() if isinstance(m, (GlydLinear, GlydEmbedding)))
    assert packed + count.other_bytes > count.need("dense11")
    warned = [r.getMessage() for r in caplog.records if r.name == LOG and r.levelno == logging.WARNING]
    assert len(warned) == 1 and "more than the" in warned[0] and "memory_limit allows" in warned[0]
    assert packed + count.other_bytes <= planned  # the plan with the tables holds it


def test_the_count_takes_the_columns_each_layout_pads(tiny_model_folder):
    # qwen2's down_proj has K = 96, stored as 128 columns in every layout: the count must see them
    # (it counted 96: fixed12's need came out 3.5% under what the packed model takes).
    src = tiny_model_folder("qwen2")
    count = count_of(src)
    for name in SPEED_ORDER:
        model = glyd.from_pretrained(src, layout=name, device="cpu", progress=False)
        stored = sum(m.packed.shape[0] * glyd.LAYOUTS[name].padded_k(m.packed.arrays)
                     for m in model.modules() if isinstance(m, (GlydLinear, GlydEmbedding)))
        lay = glyd.LAYOUTS[name]
        tables = sum(n * lay.row_bytes(k) for k, n in count.rows) if lay.row_bytes else 0
        assert count.need(name) == round(stored * lay.bits / 8 + tables) + count.other_bytes, name


def test_the_rows_of_an_empty_matrix_are_counted_too():
    m = torch.nn.Sequential(torch.nn.Linear(0, 4), torch.nn.Linear(96, 3)).bfloat16()
    assert WeightsCount.of(m).need("fixed12") == round(3 * 128 * 12.05 / 8) + (4 + 3) * 2  # K = 0 pads to 0


def test_auto_does_not_take_a_layout_whose_padded_matrices_pass_the_limit(tiny_model_folder):
    src = tiny_model_folder("qwen2")
    fixed12 = glyd.from_pretrained(src, layout="fixed12", device="cpu", progress=False)
    took = sum(m.packed.nbytes for m in fixed12.modules() if isinstance(m, (GlydLinear, GlydEmbedding)))
    took += count_of(src).other_bytes
    model = glyd.from_pretrained(src, device="cpu", memory_limit=took - 1, progress=False)
    assert layouts_of(model) != {"fixed12"}  # fixed12 takes a byte more than allowed


@pytest.mark.parametrize("family", ["llama", "gemma"])  # tied embeddings
def test_a_tied_weight_counts_once_when_loading(tiny_model_folder, family, packs):
    # The loader counts on the empty model, built without the tie: lm_head's weight counted again
    # (25% more here; Llama-3.2-1B's embedding is a fifth of it) chose a slower layout than fits.
    src = tiny_model_folder(family)
    limit = count_of(src).need("fixed12")
    model = glyd.from_pretrained(src, device="cpu", memory_limit=limit, progress=False)
    assert layouts_of(model) == {"fixed12"} and set(packs) == {"fixed12"}


def test_a_need_a_byte_over_the_limit_is_not_shown_equal_to_it(caplog):
    need = COUNT.need("fixed12")  # 12.05 GiB: a byte less reads 12.05 GiB too
    with caplog.at_level(logging.INFO, logger=LOG):
        fit_layout(COUNT, "auto", need - 1)
    line = [r.getMessage() for r in caplog.records if r.name == LOG][0]
    assert f"fixed12 needs {need:,} bytes, {need - 1:,} bytes allowed" in line
    with pytest.raises(GlydError, match=f"need {need:,} bytes, memory_limit allows {need - 1:,} bytes"):
        fit_layout(COUNT, "fixed12", need - 1)


def test_a_glyd_folder_fits_the_limit_glyd_fit_gives_it(tiny_model_folder, tmp_path):
    # check_stored summed the files' sizes, headers included: glyd fit's (and the loaded model's)
    # bytes were refused
    from glyd.apps.fit import run_fit

    out = tmp_path / "packed"
    glyd.save_pretrained(glyd.from_pretrained(tiny_model_folder("qwen2"), layout="fixed12", device="cpu",
                                              progress=False), out)
    need = run_fit(str(out), "80GB", context=16)[0].weights_glyd
    model = glyd.from_pretrained(out, device="cpu", memory_limit=need, progress=False)
    held = sum(m.packed.nbytes for m in model.modules() if isinstance(m, (GlydLinear, GlydEmbedding)))
    assert held + sum(p.numel() * p.element_size() for p in model.parameters()) == need
    with pytest.raises(GlydError, match="as stored"):
        glyd.from_pretrained(out, device="cpu", memory_limit=need - 1, progress=False)


def test_a_registered_layout_without_planning_bits_is_not_called_unknown():
    import dataclasses

    from glyd.codec import register
    from glyd.codec.layout import unregister

    register(dataclasses.replace(glyd.LAYOUTS["fixed12"], name="nobits", bits=None, kernels={}))
    try:
        with pytest.raises(GlydError, match="layout 'nobits' has no planning bits a weight") as e:
            fit_layout(COUNT, "nobits", 2**40)
        assert "unknown" not in str(e.value)
    finally:
        unregister("nobits")


def test_a_parameter_kept_in_float32_counts_its_four_bytes(tiny_model_folder):
    # compress counts a loaded model: a norm kept in float32 (transformers' _keep_in_fp32_modules_strict
    # does so) stays as it is, 4 bytes a value; it was counted at bf16's 2.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_folder("llama"), dtype=torch.bfloat16)
    model.model.norm.float()
    count = WeightsCount.of(model)
    glyd.compress(model, layout="fixed12", progress=False)
    left = list(model.parameters())
    assert any(p.dtype == torch.float32 for p in left)
    assert count.other_bytes == sum(p.nbytes for p in left)


def test_a_tied_head_the_folder_stores_apart_is_counted_as_the_loader_packs_it(tiny_model_folder, tmp_path, packs):
    # config.json ties lm_head to the embedding, but the folder stores lm_head.weight with other values:
    # the loader packs it apart (as transformers unties it); glyd fit counted it at bf16's 2 bytes as
    # "other" and the loader's own count not at all (fixed12 chosen, then over the limit).
    from safetensors.torch import load_file, save_file

    from glyd.apps.fit import run_fit

    src = tmp_path / "tied-head-apart"
    shutil.copytree(tiny_model_folder("llama"), src)
    state = load_file(str(src / "model.safetensors"))
    state["lm_head.weight"] = state["model.embed_tokens.weight"].flip(0).contiguous()
    save_file(state, str(src / "model.safetensors"), metadata={"format": "pt"})
    model = glyd.from_pretrained(src, layout="fixed12", device="cpu", progress=False)
    assert isinstance(model.lm_head, GlydLinear)
    held = sum(m.packed.nbytes for m in model.modules() if isinstance(m, (GlydLinear, GlydEmbedding)))
    held += sum(p.nbytes for p in model.parameters())
    for name in SPEED_ORDER:
        e, _ = run_fit(str(src), "80GB", context=16, layout=name)
        loader = count_of(src)  # transformers unties it too: the loaded model's count
        assert e.weights_glyd == loader.need(name), name
    assert loader.need("fixed12") >= held
    packs.clear()
    glyd.from_pretrained(src, device="cpu", memory_limit=loader.need("fixed12") - 1, progress=False)
    assert set(packs) == {"dense11"} and len(packs) == 2 + 7 * 2  # embedding, lm_head, 7 a layer
