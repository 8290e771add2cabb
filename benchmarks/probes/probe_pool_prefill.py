"""CPU probe (issue 34): one prefill forward through a DynamicCache, transformers' StaticCache and
GlydStaticCache on a small random Qwen2-shaped bf16 model. CPU timings show host-side structure only."""
import sys, time
import torch
sys.path.insert(0, "benchmarks")
from scale import _build, _config  # noqa: E402
from transformers import StaticCache  # noqa: E402
from glyd.kv import GlydStaticCache, enable_fused  # noqa: E402

torch.manual_seed(0)
model = _build(_config("tiny"), "bf16", "cpu").eval()
enable_fused(model)
for prompt in (512, 2048):
    ids = torch.randint(0, model.config.vocab_size, (1, prompt))
    caches = {"dynamic": lambda: None,
              "static_bf16": lambda: StaticCache(model.config, max_cache_len=prompt),
              "glyd_pool": lambda: GlydStaticCache(model.config, max_cache_len=prompt)}
    for name, make in caches.items():
        c = make()
        best = 1e9
        for _ in range(4):
            if c is not None:
                c.reset()
            t = time.perf_counter()
            with torch.no_grad():
                out = model(input_ids=ids, use_cache=True, logits_to_keep=1, past_key_values=c).logits
            best = min(best, time.perf_counter() - t)
        print(f"prompt {prompt} {name:12s} {best*1e3:8.1f} ms")

# host reads of device values (each one a wait for the GPU there) in one 512-token prefill, and glyd op calls
counts = {}
orig = {n: getattr(torch.Tensor, n) for n in ("item", "tolist", "__int__", "__bool__")}


def counting(name):
    def f(self, *a, **kw):
        counts[name] = counts.get(name, 0) + 1
        return orig[name](self, *a, **kw)
    return f


ids = torch.randint(0, model.config.vocab_size, (1, 512))
for name, make in (("static_bf16", lambda: StaticCache(model.config, max_cache_len=512)),
                   ("glyd_pool", lambda: GlydStaticCache(model.config, max_cache_len=512))):
    c = make()
    with torch.no_grad():
        model(input_ids=ids, use_cache=True, logits_to_keep=1, past_key_values=c)  # makes the pool
        c.reset()
        counts.clear()
        for n in orig:
            setattr(torch.Tensor, n, counting(n))
        with torch.profiler.profile() as prof:
            model(input_ids=ids, use_cache=True, logits_to_keep=1, past_key_values=c)
        for n, f in orig.items():
            setattr(torch.Tensor, n, f)
    ops = sum(e.count for e in prof.key_averages() if e.key.startswith("glyd::"))
    print(f"{name:12s} host reads of tensors {dict(counts)}; glyd op calls {ops}")
