"""Writes tests/data/kernels/h200_choices.json: the fused-linear config the H200 choice made for
every (M, N, K) of a grid and every availability of the Gluon, wgmma and warp-specialized kernels,
as ``kernels/fixed12.default_config`` (the decision tree the H200 sweeps wrote, 2026-11-30 to
12-01) returned it, recorded on 2026-12-01 before that tree became the table
``kernels/tables/NVIDIA H200.json``. test_registry checks the table gives the same choices.

    TRITON_INTERPRET=1 .venv/bin/python tests/kernels/make_choices_golden.py
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

NS = [16, 64, 500, 512, 1000, 1024, 2048, 3584, 4096, 4608, 5120, 8192, 14336, 18944, 27648, 28672, 37888,
      57344, 65535, 65536, 128256, 151936, 152064]
KS = [64, 100, 128, 256, 384, 512, 896, 1024, 2048, 3584, 3648, 4096, 5120, 8191, 8192, 8256, 14336, 18944,
      27648, 28672]
MS = [1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17, 24, 32, 33, 48, 64, 65, 128, 255, 256, 257, 1000, 4096]
AVAIL = [(False, False, False), (True, False, False), (True, True, False), (True, True, True)]


def main() -> None:
    from glyd.kernels import fixed12

    configs: list[dict] = []
    index: dict[str, int] = {}
    table = []
    for gluon, wg, ws in AVAIL:
        fixed12.gluon_available = lambda g=gluon: g
        fixed12.wg_available = lambda w=wg: w
        fixed12.ws_available = lambda s=ws: s
        for m in MS:
            for n in NS:
                for k in KS:
                    d = dataclasses.asdict(fixed12.default_config(m, n, k))
                    key = json.dumps(d, sort_keys=True)
                    if key not in index:
                        index[key] = len(configs)
                        configs.append(d)
                    table.append(index[key])
    out = Path(__file__).resolve().parents[1] / "data" / "kernels" / "h200_choices.json"
    out.write_text(json.dumps({"ms": MS, "ns": NS, "ks": KS, "avail": AVAIL, "configs": configs,
                               "choice": table}, separators=(",", ":")) + "\n")
    print(f"{out}: {len(table)} choices, {len(configs)} distinct configs")


if __name__ == "__main__":
    main()
