"""GlydExperts: transformers' experts modules with packed 3-D weights; exact mode gives bf16's
result bit for bit under each of transformers' experts implementations."""

from __future__ import annotations

import copy

import pytest
import torch

from glyd.codec import pack_experts
from glyd.errors import FormatError
from glyd.nn import GlydExperts, set_exact
from glyd.nn.experts import PackedExpertsWeight, is_packable

transformers = pytest.importorskip("transformers")


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def _mixtral_experts(experts: int = 6):
    cfg = transformers.MixtralConfig(hidden_size=32, intermediate_size=48, num_local_experts=experts,
                                     num_experts_per_tok=2, num_attention_heads=4, num_key_value_heads=2)
    cfg._experts_implementation_internal = "grouped_mm"
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    torch.manual_seed(0)
    m = MixtralExperts(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.02)
    return cfg, m


def _packed(m, layout="fixed12"):
    return {n: pack_experts(getattr(m, n).detach(), layout) for n in is_packable(m)}


def _route(tokens: int, experts: int, top_k: int = 2, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, 32, generator=g).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    w = torch.softmax(torch.randn(tokens, top_k, generator=g), dim=-1)
    return h, idx, w


@pytest.mark.parametrize("impl", ["grouped_mm", "eager", "batched_mm"])
def test_exact_is_bf16_bit_for_bit_under_each_implementation(impl):
    cfg, ref = _mixtral_experts()
    mod = GlydExperts(copy.deepcopy(ref), _packed(ref), exact=True)
    mod.source.config = ref.config = cfg  # one config: the implementation switch reaches both
    cfg._experts_implementation_internal = impl
    for tokens in (1, 5, 19):
        h, idx, w = _route(tokens, 6, seed=tokens)
        want = ref(h, idx, w)
        assert torch.equal(bits(mod(h, idx, w)), bits(want)), (impl, tokens)


def test_fused_is_close_to_float64():
    _, ref = _mixtral_experts()
    mod = GlydExperts(copy.deepcopy(ref), _packed(ref))
    h, idx, w = _route(7, 6)
    x = h.double()
    want = torch.zeros(7, 32, dtype=torch.float64)
    for t in range(7):
        for j in range(2):
            e = int(idx[t, j])
            gate, up = (x[t] @ ref.gate_up_proj[e].double().T).chunk(2)
            want[t] += (torch.nn.functional.silu(gate) * up) @ ref.down_proj[e].double().T * float(w[t, j])
    got = mod(h, idx, w)
    assert got.dtype == torch.bfloat16
    err = (got.double() - want).abs().max().item()
    assert err <= 2.0**-6 * want.abs().max().item(), err


def test_the_module_holds_the_checkpoints_keys_and_gives_the_weights_back():
    _, ref = _mixtral_experts()
    want = {n: getattr(ref, n).detach().clone() for n in ("gate_up_proj", "down_proj")}
    mod = GlydExperts(ref, _packed(ref, "tiered"))
    keys = set(mod.state_dict())
    assert "gate_up_proj_glyd_sm" in keys and "down_proj_glyd_lens" in keys and "gate_up_proj" not in keys
    assert "gate_up_proj" not in ref._parameters  # taken off the source: one copy, packed
    w = mod.gate_up_proj
    assert isinstance(w, PackedExpertsWeight) and tuple(w.shape) == (6, 96, 32) and w.dim() == 3
    assert torch.equal(bits(w.materialize()), bits(want["gate_up_proj"]))
    assert torch.equal(bits(mod.unpack("down_proj", torch.tensor([4, 1]))), bits(want["down_proj"][[4, 1]]))
    plain = mod.dequantized()
    assert type(plain).__name__ == "MixtralExperts"
    for n, t in want.items():
        assert isinstance(plain._parameters[n], torch.nn.Parameter) and torch.equal(bits(plain._parameters[n]), bits(t))


def test_set_exact_switches_experts_too():
    _, ref = _mixtral_experts()
    root = torch.nn.Sequential(GlydExperts(ref, _packed(ref)))
    set_exact(root, True)
    assert root[0].exact
    set_exact(root, False)
    assert not root[0].exact


def test_what_is_packable():
    _, ref = _mixtral_experts()
    assert is_packable(ref) == ("gate_up_proj", "down_proj")
    assert is_packable(torch.nn.Linear(2, 2)) == ()
    cfg = transformers.GptOssConfig(hidden_size=32, intermediate_size=48, num_local_experts=4, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=8)
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    assert is_packable(GptOssExperts(cfg)) == ()  # stored transposed [E, K, N]: left as it is


def test_bad_arguments_are_named():
    _, ref = _mixtral_experts()
    packed = _packed(ref)
    with pytest.raises(ValueError, match="packs gate_up_proj, down_proj, got packed down_proj"):
        GlydExperts(copy.deepcopy(ref), {"down_proj": packed["down_proj"]})
    with pytest.raises(ValueError, match=r"down_proj: packed experts are \[6, 32, 40\]"):
        GlydExperts(copy.deepcopy(ref), {**packed, "down_proj": pack_experts(torch.zeros(6, 32, 40, dtype=torch.bfloat16))})
    with pytest.raises(ValueError, match="GlydExperts packs no weights of it"):
        GlydExperts(torch.nn.Linear(2, 2), {})


class _BiasedExperts(torch.nn.Module):
    """An experts module in transformers' convention without a gate, with biases and a buffer."""

    num_experts, has_gate, has_bias, is_transposed = 3, False, True, False

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(2)
        self.up_proj = torch.nn.Parameter((torch.randn(3, 40, 32, generator=g) * 0.05).to(torch.bfloat16))
        self.up_proj_bias = torch.nn.Parameter((torch.randn(3, 40, generator=g) * 0.05).to(torch.bfloat16))
        self.down_proj = torch.nn.Parameter((torch.randn(3, 32, 40, generator=g) * 0.05).to(torch.bfloat16))
        self.down_proj_bias = torch.nn.Parameter((torch.randn(3, 32, generator=g) * 0.05).to(torch.bfloat16))
        self.register_buffer("scale", torch.tensor(2.0, dtype=torch.bfloat16))
        self.act_fn = torch.nn.ReLU()

    def _apply_gate(self, h):  # pragma: no cover - has_gate is False
        raise AssertionError

    def forward(self, h, idx, w):
        out = torch.zeros(h.shape[0], 32, dtype=torch.float32)
        for j in range(idx.shape[1]):
            e = idx[:, j]
            up = torch.einsum("tk,tnk->tn", h, self.up_proj[e]) + self.up_proj_bias[e]
            y = torch.einsum("tk,tnk->tn", self.act_fn(up), self.down_proj[e]) + self.down_proj_bias[e]
            out += y.float() * w[:, j:j + 1] * self.scale.float()
        return out.to(h.dtype)


def test_an_experts_module_with_biases_and_no_gate():
    ref = _BiasedExperts()
    src = copy.deepcopy(ref)
    mod = GlydExperts(src, _packed(src, "dense11"), exact=True)
    assert {"up_proj_bias", "down_proj_bias", "scale"} <= set(mod.state_dict())
    assert not src._parameters and not src._buffers  # moved, not shared: .to() moves one copy
    h, idx, w = _route(5, 3)
    assert torch.equal(bits(mod(h, idx, w)), bits(ref(h, idx, w)))  # the source's forward: its buffer too
    plain = mod.dequantized()
    assert torch.equal(bits(plain.up_proj_bias), bits(ref.up_proj_bias)) and float(plain.scale) == 2.0
    assert torch.equal(bits(plain.up_proj), bits(ref.up_proj))


def test_fused_an_empty_token_batch_gives_an_empty_result():
    # a reshape of the zero rows with -1 raised "cannot reshape tensor of 0 elements" from deep inside
    _, ref = _mixtral_experts()
    mod = GlydExperts(copy.deepcopy(ref), _packed(ref))
    h, idx, w = _route(3, 6)
    out = mod(h[:0], idx[:0], w[:0])
    assert out.shape == (0, 32) and out.dtype == torch.bfloat16


def test_fused_refuses_routing_that_does_not_fit_the_tokens_naming_it():
    # top_k_weights [1, 1] broadcast over every row gave a wrong result silently (bf16's eager raises)
    _, ref = _mixtral_experts()
    mod = GlydExperts(copy.deepcopy(ref), _packed(ref))
    h, idx, w = _route(5, 6)
    with pytest.raises(ValueError, match=r"top_k_weights has shape \(1, 1\); top_k_index's \(5, 2\) is needed"):
        mod(h, idx, w[:1, :1])
    with pytest.raises(ValueError, match=r"top_k_weights has shape \(5,\); top_k_index's \(5, 2\) is needed"):
        mod(h, idx, w[:, 0])
    with pytest.raises(ValueError, match=r"top_k_index has shape \(4, 2\): \[tokens, top_k\] for the 5 tokens"):
        mod(h, idx[:4], w[:4])
    with pytest.raises(ValueError, match=r"top_k_index has shape \(5,\): \[tokens, top_k\] for the 5 tokens"):
        mod(h, idx[:, 0], w[:, 0])
    with pytest.raises(ValueError, match=r"hidden_states has shape \(1, 5, 32\): \[tokens, 32\] is needed"):
        mod(h.reshape(1, 5, 32), idx, w)
    with pytest.raises(TypeError, match="top_k_index must be an int32 or int64 tensor of expert ids, got torch.float32"):
        mod(h, idx.float(), w)
    with pytest.raises(IndexError, match="top_k_index: ids hold expert 6, outside the 6 experts"):
        mod(h, torch.where(idx == 0, 6, idx), w)


@pytest.mark.parametrize("impl, ids", [("batched_mm", [[1, 6], [2, 3], [4, -1], [3, 7]]),
                                       ("grouped_mm", [[1, 6], [2, 3], [4, 1], [3, 7]])])
def test_exact_with_ids_outside_the_experts_is_bf16_bit_for_bit(impl, ids):
    # transformers' batched_mm clamps ids outside the experts (expert-parallel sentinels) and reads
    # experts 0 and E-1 for them: exact mode had left those zero when no token chose them. (grouped_mm
    # masks ids >= E; a negative id makes its bf16 result read uninitialised memory: not compared.)
    cfg, ref = _mixtral_experts()
    mod = GlydExperts(copy.deepcopy(ref), _packed(ref), exact=True)
    mod.source.config = ref.config = cfg
    cfg._experts_implementation_internal = impl
    h, _, w = _route(4, 6)
    idx = torch.tensor(ids)  # no token chose expert 0 or 5
    want = ref(h, idx, w)
    assert torch.equal(bits(mod(h, idx, w)), bits(want))


@pytest.mark.parametrize("exact", [False, True])
def test_damaged_buffers_are_named_by_weight_in_a_forward(exact):
    # a forward over a buffer replaced by a shorter one said only "lens gives 480 entries of array
    # 'lo' to the experts, but it has 479": which of the module's weights was not named
    _, ref = _mixtral_experts()
    mod = GlydExperts(copy.deepcopy(ref), _packed(ref), exact=exact)
    mod.down_proj_glyd_lo = mod.down_proj_glyd_lo[:-1]
    h, idx, w = _route(3, 6)
    with pytest.raises(FormatError, match=r"^down_proj: packed array 'lo' has shape \(191, 64\), expected \(192, 64\)"):
        mod(h, idx, w)


def _qwen3_experts(experts: int = 6, hidden: int = 64, inter: int = 64):
    # K = 64 for both products: the unpack + grouped GEMM can take them (K a multiple of 64)
    cfg = transformers.Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=inter, num_experts=experts,
                                      num_experts_per_tok=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    cfg._experts_implementation_internal = "grouped_mm"
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    torch.manual_seed(1)
    m = Qwen3MoeExperts(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.02)
        m.gate_up_proj.view(-1)[::97] = 3.0  # exceptions
    return cfg, m


@pytest.fixture
def kernels_on_cpu():
    """The experts ops' CUDA implementations (glyd.kernels) for CPU tensors, through Triton's interpreter."""
    pytest.importorskip("triton")
    from glyd.ops import experts as ops

    lib = torch.library.Library("glyd", "IMPL")  # noqa: TOR901 - destroyed below
    lib.impl("experts_linear", ops._experts_linear_cuda, "CPU")
    lib.impl("experts_linear_sorted", ops._experts_linear_sorted_cuda, "CPU")
    lib.impl("experts_route", ops._experts_route_cuda, "CPU")
    try:
        yield
    finally:
        lib._destroy()


@pytest.mark.parametrize("tokens", [5, 1100])  # 10 rows: the grouped GEMV; 2200: the unpack + grouped GEMM
def test_one_routing_for_both_products_equals_each_products_own_bit_for_bit(kernels_on_cpu, monkeypatch, tokens):
    # the block's rows sorted once (route, experts_linear_sorted: activation in sorted order, rows put back
    # once) against each product routing its own rows (experts_linear): the same kernels on the same rows,
    # so the same bits; and the sort is taken where the kernel would sort (2200 rows), not for 10
    from glyd.kernels import experts as kernels
    from glyd.ops import experts as ops

    cfg, ref = _qwen3_experts()
    mod = GlydExperts(copy.deepcopy(ref), _packed(ref))
    g = torch.Generator().manual_seed(tokens)
    h = torch.randn(tokens, 64, generator=g).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(6, generator=g)[:2] for _ in range(tokens)])
    w = torch.softmax(torch.randn(tokens, 2, generator=g), dim=-1).to(torch.bfloat16)
    calls = []
    real_route = ops.route
    monkeypatch.setattr(ops, "route", lambda *a: calls.append(1) or real_route(*a))
    sorts = kernels.sorts_rows("fixed12", mod.packed_shapes["gate_up_proj"], 2 * tokens, torch.device("cpu"))
    assert sorts == (tokens > 1024)
    monkeypatch.setattr(ops, "sorts_rows", lambda *a: False)
    own = mod(h, idx, w)
    monkeypatch.setattr(ops, "sorts_rows", lambda *a: True)
    shared = mod(h, idx, w)
    assert calls == [1] and shared.dtype == torch.bfloat16 and shared.shape == (tokens, 64)
    assert torch.equal(bits(shared), bits(own))
    err = (shared.float() - ref(h, idx, w).float()).abs().max().item()  # bf16's grouped_mm block: close
    assert err <= 0.05 * ref(h, idx, w).float().abs().max().item(), err
    set_exact(mod, True)  # exact mode: the source's forward, bf16's bits whatever the fused path does
    assert torch.equal(bits(mod(h, idx, w)), bits(ref(h, idx, w)))


def test_one_routing_checks_the_ids_once_and_names_ids_outside_the_experts(kernels_on_cpu, monkeypatch):
    # route's flag is the block's one check (the sorted products skip theirs on its ids); each
    # product checks its own ids otherwise
    from glyd.ops import experts as ops

    _, ref = _qwen3_experts()
    mod = GlydExperts(copy.deepcopy(ref), _packed(ref))
    h = torch.randn(3, 64).to(torch.bfloat16)
    asserts = []
    real_assert = torch._assert_async
    monkeypatch.setattr(torch, "_assert_async", lambda *a: asserts.append(a[-1]) or real_assert(*a))
    for shared, want in ((True, ["glyd experts_route: ids outside the experts"]),
                         (False, ["glyd experts_linear: ids outside the experts"] * 2)):
        monkeypatch.setattr(ops, "sorts_rows", lambda *a, on=shared: on)
        asserts.clear()
        mod(h, torch.tensor([[0, 5], [1, 2], [3, 4]]), torch.rand(3, 2))
        assert asserts == want
    monkeypatch.setattr(ops, "sorts_rows", lambda *a: True)
    with pytest.raises(RuntimeError, match="ids outside the experts"):
        mod(h, torch.tensor([[0, 6], [1, 2], [3, 4]]), torch.rand(3, 2))
    monkeypatch.setattr(ops, "sorts_rows", lambda *a: False)
    with pytest.raises(RuntimeError, match="ids outside the experts"):
        mod(h, torch.tensor([[0, -1], [1, 2], [3, 4]]), torch.rand(3, 2))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_one_routing_block_captures_and_equals_each_products_own():
    # a prompt-sized block (3000 rows): the sorted path eagerly and in a CUDA graph equals each
    # product's own routing bit for bit; the graph follows new routing on replay
    from glyd.ops import experts as ops

    _, ref = _qwen3_experts(experts=16)
    mod = GlydExperts(copy.deepcopy(ref), _packed(ref)).cuda()  # packed on the CPU, moved
    tokens = 1500
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(tokens, 64, device="cuda", generator=g).to(torch.bfloat16)
    idx = torch.randint(0, 16, (tokens, 2), device="cuda", generator=g)
    w = torch.rand(tokens, 2, device="cuda", generator=g).to(torch.bfloat16)
    assert ops.sorts_rows(h, 2 * tokens, "fixed12", mod.packed_shapes["gate_up_proj"])
    shared = mod(h, idx, w)
    own = mod._products(h, idx.reshape(-1), 2)
    own = (own * w.reshape(-1, 1)).view(tokens, 2, -1).sum(dim=1).to(torch.bfloat16)
    assert torch.equal(bits(shared), bits(own))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mod(h, idx, w)
    idx.copy_(torch.randint(0, 16, (tokens, 2), device="cuda", generator=g))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(bits(out), bits(mod(h, idx, w)))


def test_one_routing_block_makes_no_host_sync(kernels_on_cpu, monkeypatch):
    # what a CUDA graph capture needs of the block (checked on the CPU): no op that reads a value
    # back to the host (_local_scalar_dense: .item(), .tolist(), bool(t)) between route and the sum
    from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

    from glyd.kernels import _interp
    from glyd.kernels import experts as kernels
    from glyd.ops import experts as ops

    class Reads(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "glyd":  # its CUDA implementation, inside the mode
                with self:
                    return getattr(ops, f"_{func.overloadpacket.__name__}_cuda")(*args, **(kwargs or {}))
            self.seen.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    real, real_tolist, watching = _interp._Isolated.__getitem__, torch.Tensor.tolist, [False]

    def launch_outside_the_mode(self, grid):  # the interpreter's own reads are not the GPU's
        run = real(self, grid)

        def call(*a, **kw):
            was, watching[0] = watching[0], False
            try:
                with _disable_current_modes():
                    return run(*a, **kw)
            finally:
                watching[0] = was
        return call

    def tolist(t):  # reads the data without a dispatch: no mode sees it
        if watching[0]:
            mode.seen.append("tolist")
        return real_tolist(t)

    monkeypatch.setattr(_interp._Isolated, "__getitem__", launch_outside_the_mode)
    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    monkeypatch.setattr(ops, "sorts_rows", lambda *a: True)
    grouped = (kernels.ExpertsGroupedKernel, kernels.ExpertsGroupedConfig())  # the prompt's kernel, at 80 rows
    monkeypatch.setattr(kernels, "choose", lambda *a: grouped)
    _, ref = _qwen3_experts()
    mod = GlydExperts(copy.deepcopy(ref), _packed(ref))
    h, idx, w = torch.randn(40, 64).to(torch.bfloat16), torch.randint(0, 6, (40, 2)), torch.rand(40, 2)
    mod(h, idx, w)  # prepared: what a capture finds built
    mode = Reads()
    with mode, torch.no_grad():
        watching[0] = True
        mod(h, idx, w)
        watching[0] = False
    assert mode.seen.count("_grouped_mm") == 2 and mode.seen.count("index_copy_") == 1  # it saw the block
    assert not {"item", "_local_scalar_dense", "tolist"} & set(mode.seen), mode.seen


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tokens", [3, 1500])  # the per-product path and the one-routing (sorted) path
def test_gpu_biased_experts_in_a_graph_give_nan_rows_for_ids_outside(tokens):
    # inside a graph an id outside the experts gives its token NaN (the documented rule); the biases'
    # lookup indexed with it ended the graph in a device-side assert instead
    src = _BiasedExperts()
    mod = GlydExperts(copy.deepcopy(src), _packed(src)).cuda()
    g = torch.Generator(device="cuda").manual_seed(3)
    h = torch.randn(tokens, 32, device="cuda", generator=g).to(torch.bfloat16)
    idx = torch.randint(0, 3, (tokens, 2), device="cuda", generator=g)
    w = torch.rand(tokens, 2, device="cuda", generator=g).to(torch.bfloat16)
    mod(h, idx, w)  # warm-up: the exception indices are built
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mod(h, idx, w)
    want = mod(h, idx, w)
    idx[0, 1] = 3
    idx[-1, 0] = -1
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isnan(out[0]).all() and torch.isnan(out[-1]).all()
    assert torch.equal(bits(out[1:-1]), bits(want[1:-1]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tokens", [3, 1500])
def test_gpu_experts_called_with_grad_on_give_the_no_grad_bits(tokens):
    # a biased experts module's hidden states require grad (its bias is a Parameter): at 1500 tokens the
    # per-expert unpack + cuBLAS product wrote into its output with out=, which autograd refused
    src = _BiasedExperts()
    mod = GlydExperts(copy.deepcopy(src), _packed(src)).cuda()
    g = torch.Generator(device="cuda").manual_seed(4)
    h = torch.randn(tokens, 32, device="cuda", generator=g).to(torch.bfloat16)
    idx = torch.randint(0, 3, (tokens, 2), device="cuda", generator=g)
    w = torch.rand(tokens, 2, device="cuda", generator=g).to(torch.bfloat16)
    with torch.no_grad():
        want = mod(h, idx, w)
    got = mod(h, idx, w)
    assert torch.equal(bits(got), bits(want))
