"""Run by test_kv_fixed_attention with TRITON_INTERPRET=0: compile the kvf12 decode kernel for sm_90 (no
GPU needed) as the launcher would and print each bf16 tensor-core dot's ``K`` and ``kWidth`` (``DOT``
lines; see ``_layout_check.py`` for why ``K >= 4 * kWidth`` matters). Arguments: ``D,G,TS[,SWAR]`` ...
(``SWAR`` 1: the decode on 32-bit words, ``lo`` and ``code`` read as int32)."""

from __future__ import annotations

import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from glyd.kv import _triton_fixed as kf
from glyd.kv._triton import qk_f32


def main() -> int:
    sig = {"q_ptr": "*bf16", "lens_ptr": "*i32", "starts_ptr": "*i32", "valid_ptr": "*u8", "VS": "i32",
           "bidx_ptr": "*i32"}
    for pre in "kv":
        sig.update({f"{pre}_lo": "*u8", f"{pre}_code": "*u8", f"{pre}_base": "*u8", f"{pre}_meta": "*i32",
                    f"{pre}_exc": "*i32", f"{pre}_raw": "*bf16"})
    sig.update({"m_out": "*fp32", "l_out": "*fp32", "acc_out": "*fp32", "qk_scale": "fp32", "H": "i32",
                "J": "i32", "CAP": "i32", "PAGES_PER_SPLIT": "i32", "S": "i32"})
    for arg in sys.argv[1:]:
        d, g, ts, swar = (int(v) for v in (arg + ",0").split(",")[:4])
        # with the attention mask's row read (GlydStaticCache's decode steps always read it)
        const = dict(G=g, GP=16, P=64, D=d, DV=d, F32=False, TS=ts, QK_F32=qk_f32(d // 2), HAS_VALID=True,
                     SWAR=bool(swar), PRMT=True)
        s = dict(sig)
        if swar:
            s.update({f"{pre}_{a}": "*i32" for pre in "kv" for a in ("lo", "code")})
        s.update({k: "constexpr" for k in const})
        k = triton.compile(ASTSource(fn=kf._kvf_decode_split_kernel, signature=s, constexprs=const),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        dots = re.findall(r"tt\.dot [^\n]*?: tensor<(\d+)x(\d+)x(bf16|f16), #ttg\.dot_op<\{opIdx = 0, "
                          r"parent = #mma\d*, kWidth = (\d+)\}>>", k.asm["ttgir"])
        for m_, k_, _, kw in dots:
            print(f"DOT d={d} sub_tile={ts} swar={swar} M={m_} K={k_} kWidth={kw}")
        print(f"CUBIN d={d} sub_tile={ts} swar={swar} bytes={len(k.asm['cubin'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
