"""Run by test_kv_pool with TRITON_INTERPRET=0: compile the static pool's page writer (one side, and the pair
kernel of both sides) for sm_90 (no GPU needed) as the launchers would, for each ``P,D`` argument, and print a
``CUBIN`` and a ``PAIR`` line (its histogram,
gathers, argmax and atomic must lower for the GPU, which the interpreter never checks)."""

from __future__ import annotations

import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from glyd.kv import _triton_pool as kp


def main() -> int:
    sig = {"x_ptr": "*i16", "lens_ptr": "*i32", "bidx_ptr": "*i32", "lo_ptr": "*u8", "code_ptr": "*u8",
           "base_ptr": "*u8", "meta_ptr": "*i32", "exc_ptr": "*i32", "used_ptr": "*i32", "raw_ptr": "*i16",
           "T": "i32", "J": "i32", "E": "i32", "H": "i32"}
    for arg in sys.argv[1:]:
        p, d = (int(v) for v in arg.split(","))
        const = dict(P=p, D=d)
        s = dict(sig)
        s.update({k: "constexpr" for k in const})
        k = triton.compile(ASTSource(fn=kp._kvf12_write_kernel, signature=s, constexprs=const),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        print(f"CUBIN P={p} D={d} bytes={len(k.asm['cubin'])} atomics={k.asm['ptx'].count('atom.')}")
        # the pair kernel (keys and values in one launch): both sides' atomics
        s2 = {"xk_ptr": "*i16", "xv_ptr": "*i16", "lens_ptr": "*i32", "bidx_ptr": "*i32"}
        for side in "kv":
            s2.update({f"{side}lo": "*u8", f"{side}code": "*u8", f"{side}base": "*u8", f"{side}meta": "*i32",
                       f"{side}exc": "*i32", f"{side}used": "*i32", f"{side}raw": "*i16"})
        s2.update({"T": "i32", "J": "i32", "EK": "i32", "EV": "i32", "H": "i32"})
        s2.update({k: "constexpr" for k in const})
        k = triton.compile(ASTSource(fn=kp._kvf12_write_pair_kernel, signature=s2, constexprs=const),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        print(f"PAIR P={p} D={d} bytes={len(k.asm['cubin'])} atomics={k.asm['ptx'].count('atom.')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
