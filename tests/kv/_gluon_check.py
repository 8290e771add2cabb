"""Run by test_kv_gluon with TRITON_INTERPRET=0: compile the Gluon decode kernel for sm_90 (no GPU
needed) as the launcher does (one warp, maxnreg 168, the L2 prefetch on, 7 query heads a KV head, the
attention mask's row read) and print counts from its PTX: barriers, m16n8k16 bf16 MMAs, shared-memory stores."""

from __future__ import annotations

import re

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

from glyd.kv import _gluon


def main() -> None:
    kern = _gluon._kv_gluon_kernel
    const = dict(_gluon.layouts(), G=7, GP=8, PREFETCH=True, HAS_VALID=True)  # the attention mask's row read
    ptrs = {"q_ptr": "*bf16", "lens_ptr": "*i32", "starts_ptr": "*i32", "valid_ptr": "*u8", "m_out": "*fp32",
            "l_out": "*fp32", "acc_out": "*fp32"}
    for pre in ("k_", "v_"):
        ptrs.update({pre + "sm": "*i32", pre + "dig": "*i32", pre + "top": "*i32", pre + "meta": "*i32",
                     pre + "tailw": "*i32", pre + "tail": "*u8", pre + "raw": "*bf16"})
    sig = {n: "constexpr" if n in const else ptrs.get(n, "fp32" if n == "qk_scale" else "i32") for n in kern.arg_names}
    k = triton.compile(GluonASTSource(kern, sig, const), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=1, maxnreg=168))
    ptx = k.asm["ptx"]
    print(f"barriers={len(re.findall(r'bar(rier)?[.]sync', ptx))} "
          f"mma={len(re.findall(r'mma[.]sync[.]aligned[.]m16n8k16[.]row[.]col[.]f32[.]bf16[.]bf16[.]f32', ptx))} "
          f"shared_stores={len(re.findall(r'[^a-z]st[.]shared', ptx))}")


if __name__ == "__main__":
    main()
