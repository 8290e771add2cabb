"""Lossless coding of one slice of a float tensor (a chunk) for the ``.glyd`` file archive.

A float is split into a *symbol* that carries almost all of its redundancy and *raw* bits that are
noise and stay uncoded:

=========  ======================================================  ======================
dtype      symbol (one byte, entropy coded)                        raw bits (stored)
=========  ======================================================  ======================
bf16       exponent + top 2 mantissa bits, through a per-chunk     sign + 5 mantissa bits,
           table of the <= 256 combinations that occur             packed 4 in 3 bytes
           (or the exponent alone when more than 256 occur)        (8 bits a weight then)
fp16       exponent + top 3 mantissa bits (exactly a byte)         sign + 7 mantissa bits
fp32       its high half coded as bf16                             + low 16 bits, zstd'd
                                                                   when that helps
fp8        the whole byte (e4m3 and e5m2)                          none
=========  ======================================================  ======================

Why these splits (``docs/filecodec.md``): in real weights the exponent carries ~2.6 bits of
information and the top mantissa bits a few hundredths more jointly with it; the low mantissa bits
and the sign are incompressible.

The symbols are entropy coded with zstd's Huffman coder (``zstandard``, match finding made nearly
inert by ``min_match=7``): about 0.03 bits a weight above the order-0 entropy, but it decodes fast,
where constriction's categorical ANS decoder ran at 42 M symbols/s (83 MB/s of bf16; RESULTS.md).
The gap to the entropy is won back, and more, by *line classes*: a chunk is a 2-D slice ``rows x
cols`` of its tensor; the rows (or the columns) are ranked by their mean exponent into 8 classes and
every class is coded with its own Huffman tables. Embedding tables have per-row scales (wordllama:
10.652 -> 10.555 bits a weight) and some have per-column ones (Whisper tiny.en: 10.670 -> 10.470);
the encoder estimates the entropy of each option on a sample of rows and keeps the best.

Byte layout of a chunk payload: ``docs/format.md`` ("File archives").
"""

from __future__ import annotations

import struct
import threading

import numpy as np
import zstandard as zstd

from glyd.errors import CorruptError, FormatError
from glyd.filecodec import zframe

# dtype codes as stored in a chunk, with the safetensors names they come from.
BF16, F16, F32, F8_E4M3, F8_E5M2 = 1, 2, 3, 4, 5
SAFETENSORS_DTYPES = {"BF16": BF16, "F16": F16, "F32": F32, "F8_E4M3": F8_E4M3, "F8_E5M2": F8_E5M2}
ITEMSIZE = {BF16: 2, F16: 2, F32: 4, F8_E4M3: 1, F8_E5M2: 1}
DTYPE_NAMES = {v: k for k, v in SAFETENSORS_DTYPES.items()}

MODE_NONE, MODE_ROWS, MODE_COLS = 0, 1, 2
NCLASSES = 8
#: below this many elements a chunk is coded with one model (classes cost more than they save)
MIN_CLASS_ELEMS = 1 << 16
#: elements of the sample on which the class options are compared
SAMPLE_ELEMS = 1 << 18

BLOB_RAW, BLOB_ZSTD = 0, 1

_HEADER = struct.Struct("<BBBBII")  # kind, mode, nclasses, symmode, rows, cols
_BLOB = struct.Struct("<BII")  # codec, stored length, raw length

# zstd as a Huffman coder: short matches in low-entropy symbol data cost more than the literals
# they replace, so only matches of >= 7 symbols are taken (in practice almost none).
_SYM_PARAMS = zstd.ZstdCompressionParameters(
    window_log=17, hash_log=12, chain_log=12, search_log=1, min_match=7, strategy=zstd.STRATEGY_FAST
)


def _sym_compressor() -> zstd.ZstdCompressor:
    # ZstdCompressor objects are not thread-safe: one per call (creation costs microseconds).
    return zstd.ZstdCompressor(compression_params=_SYM_PARAMS)


# ----------------------------------------------------------------------------- bit packing


#: elementwise work runs over blocks of this many elements so that its temporaries stay in cache
#: (whole-chunk temporaries made every numpy op memory- and page-fault-bound: 3x slower)
BLOCK = 1 << 16


_tls = threading.local()


def _scratch(name: str, n: int, dtype) -> np.ndarray:
    """A reusable per-thread buffer of ``n`` elements. Chunk-sized temporaries that are fresh
    memory every chunk cost as much in page faults (kernel time) as the decoding itself."""
    pool = _tls.__dict__.setdefault("pool", {})
    a = pool.get(name)
    if a is None or a.size < n or a.dtype != dtype:
        a = np.empty(max(n, 1), dtype)
        pool[name] = a
    return a[:n]


def packed6_len(n: int) -> int:
    """Bytes of :func:`pack6` output for ``n`` values."""
    full, rest = divmod(n, BLOCK)
    return full * (BLOCK // 4) * 3 + -(-rest // 4) * 3


def _pack6_block(v: np.ndarray, out: np.ndarray) -> None:
    q = out.size // 3
    if v.size != 4 * q:
        v = np.concatenate([v, np.zeros(4 * q - v.size, np.uint8)])
    a, b, c, d = v[:q], v[q : 2 * q], v[2 * q : 3 * q], v[3 * q :]
    np.bitwise_or(a, b << 6, out=out[:q])
    np.bitwise_or(b >> 2, c << 4, out=out[q : 2 * q])
    np.bitwise_or(c >> 4, d << 2, out=out[2 * q :])


def _unpack6_block(p: np.ndarray, out: np.ndarray) -> None:
    q = p.size // 3
    m = out.size
    if m != 4 * q:
        full = np.empty(4 * q, np.uint8)
        _unpack6_block(p, full)
        out[:] = full[:m]
        return
    p0, p1, p2 = p[:q], p[q : 2 * q], p[2 * q :]
    np.bitwise_and(p0, 63, out=out[:q])
    np.bitwise_or(p0 >> 6, (p1 & np.uint8(15)) << 2, out=out[q : 2 * q])
    np.bitwise_or(p1 >> 4, (p2 & np.uint8(3)) << 4, out=out[2 * q : 3 * q])
    np.right_shift(p2, 2, out=out[3 * q :])


def pack6(v: np.ndarray) -> np.ndarray:
    """Pack 6-bit values (uint8, < 64) four to three bytes. Planar within each block of
    ``BLOCK`` values (its four quarters share three byte planes): every op is contiguous."""
    n = v.size
    out = np.empty(packed6_len(n), np.uint8)
    po = 0
    for i in range(0, n, BLOCK):
        blk = v[i : i + BLOCK]
        size = -(-blk.size // 4) * 3
        _pack6_block(blk, out[po : po + size])
        po += size
    return out


def unpack6(p: np.ndarray, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """Inverse of :func:`pack6` (into ``out`` when given)."""
    out = np.empty(n, np.uint8) if out is None else out
    po = 0
    for i in range(0, n, BLOCK):
        m = min(BLOCK, n - i)
        size = -(-m // 4) * 3
        _unpack6_block(p[po : po + size], out[i : i + m])
        po += size
    return out


# ----------------------------------------------------------------------------- line classes


def _entropy_bits(hist: np.ndarray) -> float:
    """Bits to code the counts in ``hist`` (last axis = symbols) with one model per leading index,
    plus a rough cost of each model's table."""
    hist = hist.reshape(-1, hist.shape[-1]).astype(np.float64)
    tot = hist.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(hist > 0, hist / np.maximum(tot, 1), 1.0)
        bits = -(hist * np.log2(p)).sum()
    return float(bits + 5.0 * np.count_nonzero(hist))


def _classes(stat: np.ndarray, k: int) -> np.ndarray:
    """Class 0..k-1 of every line: quantiles of its statistic (equal-size classes)."""
    n = stat.size
    order = np.argsort(stat, kind="stable")
    cls = np.empty(n, np.uint8)
    cls[order] = (np.arange(n, dtype=np.int64) * k // n).astype(np.uint8)
    return cls


def _choose_classes(sym: np.ndarray, expo: np.ndarray) -> tuple[int, np.ndarray | None]:
    """Pick none / row classes / column classes for a ``rows x cols`` symbol matrix by the entropy
    each gives on a sample of rows. Returns (mode, class of every line)."""
    rows, cols = sym.shape
    if sym.size < MIN_CLASS_ELEMS:
        return MODE_NONE, None
    step = max(1, sym.size // SAMPLE_ELEMS)
    samp = sym[::step].astype(np.uint16)  # every step-th row
    best = (_entropy_bits(np.bincount(samp.ravel(), minlength=256)) * 0.995, MODE_NONE, None)
    k = NCLASSES
    # line statistic: the sum of its exponents (lines have equal lengths, so it ranks like the mean)
    if rows >= 4 * k:
        cls = _classes(expo.sum(axis=1, dtype=np.uint32), k)
        h = np.bincount((samp | (cls[::step, None].astype(np.uint16) << 8)).ravel(), minlength=256 * k)
        bits = _entropy_bits(h.reshape(k, 256)) + 3.0 * rows / step
        if bits < best[0]:
            best = (bits, MODE_ROWS, cls)
    if cols >= 4 * k:
        cls = _classes(expo[::step].sum(axis=0, dtype=np.uint32), k)  # from the sampled rows
        h = np.bincount((samp | (cls[None, :].astype(np.uint16) << 8)).ravel(), minlength=256 * k)
        bits = _entropy_bits(h.reshape(k, 256)) + 3.0 * cols / step
        if bits < best[0]:
            best = (bits, MODE_COLS, cls)
    return best[1], best[2]


# ----------------------------------------------------------------------------- blobs


def _as_buffer(a: np.ndarray) -> memoryview:
    """A flat byte view of an array (no copy when it is contiguous)."""
    return memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8))


def _blob_raw(a: np.ndarray) -> tuple[int, memoryview, int]:
    b = _as_buffer(a)
    return BLOB_RAW, b, len(b)


def _blob_zstd_if_smaller(a: np.ndarray, level: int = 1, keep: float = 0.97) -> tuple[int, bytes | memoryview, int]:
    b = _as_buffer(a)
    z = zstd.ZstdCompressor(level=level).compress(b)
    if len(z) < keep * len(b):
        return BLOB_ZSTD, z, len(b)
    return BLOB_RAW, b, len(b)


def _read_blob(codec: int, data: memoryview, raw_len: int, what: str, out: np.ndarray | None = None):
    """A blob's decoded bytes: a view of ``data`` (raw), or zstd-decoded into ``out`` (a uint8
    array of ``raw_len``) when given, else into new bytes."""
    if codec == BLOB_RAW:
        if len(data) != raw_len:
            raise CorruptError(f"{what}: stored {len(data)} bytes, expected {raw_len}")
        return data
    if codec == BLOB_ZSTD:
        return zframe.decode(data, raw_len, what, out)
    raise CorruptError(f"{what}: unknown blob codec {codec}")


# ----------------------------------------------------------------------------- encode

# How a bf16 (or fp32 high half) symbol holds the exponent.
SYM_EXP = 0  # the exponent byte itself; raw = sign + 7 mantissa bits
SYM_WINDOW = 1  # slot<<2 | top 2 mantissa bits; slot = exponent - base + 1, or 0 for exponent 0
SYM_TABLE = 2  # rank of the exponent in a table of <= 64 <<2 | top 2 mantissa bits

_U16 = np.uint16


def _words16(kind: int, data) -> tuple[np.ndarray, np.ndarray | None]:
    """The 16-bit words that are coded (bf16, fp16, high half of fp32) and fp32's low halves."""
    if kind != F32:
        return np.frombuffer(data, "<u2"), None
    w32 = np.frombuffer(data, "<u4")
    hi = _scratch("hi", w32.size, _U16)
    low = np.empty(w32.size, _U16)
    for i in range(0, w32.size, BLOCK):
        blk = w32[i : i + BLOCK]
        np.copyto(hi[i : i + BLOCK], blk >> 16, casting="unsafe")
        np.copyto(low[i : i + BLOCK], blk, casting="unsafe")
    return hi, low


def _split(kind: int, data):
    """-> (symbols uint8, exponent uint8 (class statistic), raw field (packed), raw width (6/8/0),
    symbol mode, table bytes, fp32 low halves or None)."""
    if kind in (F8_E4M3, F8_E5M2):
        sym = np.frombuffer(data, np.uint8)
        expo = (sym >> 3) & np.uint8(0xF) if kind == F8_E4M3 else (sym >> 2) & np.uint8(0x1F)
        return sym, expo, None, 0, SYM_EXP, b"", None
    w, low = _words16(kind, data)
    n = w.size
    # top: the sign falls off; bf16 -> exponent, fp16 -> exponent + 3 mantissa bits
    top = _scratch("top", n, np.uint8)
    raw8 = _scratch("raw8", n, np.uint8)
    t = np.empty(BLOCK, _U16)
    for i in range(0, n, BLOCK):
        blk = w[i : i + BLOCK]
        m = blk.size
        np.right_shift(blk, 7, out=t[:m])
        np.copyto(top[i : i + m], t[:m], casting="unsafe")
        np.bitwise_and(blk, 0x807F, out=t[:m])
        np.bitwise_or(t[:m], t[:m] >> 8, out=t[:m])  # sign<<7 | 7 mantissa bits (+ sign<<15)
        np.copyto(raw8[i : i + m], t[:m], casting="unsafe")
    if kind == F16 or n == 0:
        return top, (top >> 3) if kind == F16 else top, raw8, 8, SYM_EXP, b"", low
    emax, emin = int(top.max()), int(top.min())
    base = emin if emin else int((top - np.uint8(1)).min()) + 1  # smallest nonzero exponent
    if base == 256:  # all zero
        base = 1
    if emax - base <= 62:
        symmode, table = SYM_WINDOW, bytes([base, 1 if emin == 0 else 0])
        rank4 = None
    else:
        used = np.flatnonzero(np.bincount(top, minlength=256))
        if used.size > 64:  # too many exponents for 4 symbols each: the exponent alone
            return top, top, raw8, 8, SYM_EXP, b"", low
        rank4 = np.zeros(256, np.uint8)
        rank4[used] = np.arange(used.size, dtype=np.uint8) << 2
        symmode, table = SYM_TABLE, used.astype(np.uint8).tobytes()
    sym = _scratch("sym", n, np.uint8)
    raw6 = _scratch("raw6", n, np.uint8)
    a8 = np.empty(BLOCK, np.uint8)
    for i in range(0, n, BLOCK):
        blk = w[i : i + BLOCK]
        m = blk.size
        tp, s, t8 = top[i : i + m], sym[i : i + m], a8[:m]
        if rank4 is None:
            np.subtract(tp, np.uint8(base - 1), out=s)
            if emin == 0 and base > 1:
                s[tp == 0] = 0
            np.left_shift(s, 2, out=s)
        else:
            s[:] = np.frombuffer(tp.tobytes().translate(rank4.tobytes()), np.uint8)
        np.right_shift(blk, 5, out=t[:m])
        np.copyto(t8, t[:m], casting="unsafe")
        np.bitwise_and(t8, 3, out=t8)
        np.bitwise_or(s, t8, out=s)  # slot<<2 | top 2 mantissa bits
        np.bitwise_and(blk, 0x801F, out=t[:m])
        np.bitwise_or(t[:m], t[:m] >> 10, out=t[:m])  # sign<<5 | 5 mantissa bits
        np.copyto(raw6[i : i + m], t[:m], casting="unsafe")
    return sym, top, raw6, 6, symmode, table, low


def encode(kind: int, data, rows: int, cols: int) -> bytes:
    """Code ``rows x cols`` elements of dtype ``kind`` (little-endian bytes ``data``).

    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(0, 0.02, (64, 96)).astype(np.float32)
    >>> p = encode(F32, x.tobytes(), 64, 96)
    >>> decode(p, x.nbytes).tobytes() == x.tobytes()
    True
    """
    return b"".join(encode_parts(kind, data, rows, cols))


def encode_parts(kind: int, data, rows: int, cols: int) -> list:
    """:func:`encode` as a list of buffers (joined, they are the payload): saves a copy."""
    n = rows * cols
    if kind not in ITEMSIZE or len(data) != n * ITEMSIZE[kind]:
        raise FormatError(f"float chunk: {len(data)} bytes for {rows}x{cols} of dtype code {kind}")
    sym, expo, raw, raw_bits, symmode, table, low = _split(kind, data)
    mode, cls = _choose_classes(sym.reshape(rows, cols), expo.reshape(rows, cols)) if n else (MODE_NONE, None)
    blobs = []
    zc = _sym_compressor()
    if mode == MODE_NONE:
        streams = [sym]
    else:
        s2 = sym.reshape(rows, cols)
        perm = np.argsort(cls, kind="stable")
        counts = np.bincount(cls, minlength=NCLASSES)
        ends = np.cumsum(counts)
        if mode == MODE_ROWS:
            ordered = s2[perm]
            streams = [ordered[a:b] for a, b in zip(ends - counts, ends)]
        else:
            ordered = np.take(s2, perm, axis=1)
            streams = [ordered[:, a:b] for a, b in zip(ends - counts, ends)]
        blobs.append((BLOB_ZSTD, zstd.ZstdCompressor(level=9).compress(cls.tobytes()), cls.size))
    for st in streams:
        b = _as_buffer(st)
        blobs.append((BLOB_ZSTD, zc.compress(b), len(b)) if len(b) else (BLOB_RAW, b, 0))
    if raw_bits == 6:
        blobs.append(_blob_raw(pack6(raw)))
    elif raw_bits == 8:
        blobs.append(_blob_raw(raw.copy()))  # raw8 is a scratch buffer: the payload outlives it
    if low is not None:
        blobs.append(_blob_zstd_if_smaller(low))
    nclass = NCLASSES if mode != MODE_NONE else 1
    parts = [_HEADER.pack(kind, mode, nclass, symmode, rows, cols), struct.pack("<H", len(table)), table]
    parts.append(struct.pack("<I", len(blobs)))
    for codec, b, raw_len in blobs:
        parts.append(_BLOB.pack(codec, len(b), raw_len))
    for _, b, _ in blobs:
        parts.append(b)
    return parts


# ----------------------------------------------------------------------------- decode


def decode(payload, expected_len: int, what: str = "float chunk") -> np.ndarray:
    """Inverse of :func:`encode`: the chunk's bytes as a uint8 array. ``expected_len`` (bytes)
    comes from the archive's chunk record; every length inside the payload is checked against it
    before anything is allocated."""
    kind, mode, nclass, symmode, rows, cols, table, blobs = _read_header(payload, expected_len, what)
    raw_bits = _raw_bits(kind, symmode, table, what)
    want = (1 if mode == MODE_NONE else 1 + nclass) + (raw_bits > 0) + (kind == F32)
    if len(blobs) != want or (mode != MODE_NONE and nclass != NCLASSES) or (mode == MODE_NONE and nclass != 1):
        raise CorruptError(f"{what}: {len(blobs)} blobs, expected {want}")

    it = iter(blobs)
    sym = _decode_symbols(it, mode, nclass, rows, cols, what)
    if kind in (F8_E4M3, F8_E5M2):
        return sym.copy()
    raw = _read_raw_plane(next(it), rows * cols, raw_bits, what)
    if raw_bits == 8:
        w = _words_from_exponents(sym, raw)
    else:
        w = _words_from_slots(sym, raw, symmode, table, what)
    if kind != F32:
        return w.view(np.uint8)
    return _join_low_halves(w, next(it), what)


def _read_header(payload, expected_len: int, what: str) -> tuple:
    """-> (kind, mode, nclass, symmode, rows, cols, exponent table, blobs): the header, its size
    checked against ``expected_len``, and every blob as (codec, stored bytes, raw length), each
    inside the payload, which they fill exactly."""
    mv = memoryview(payload)
    try:
        kind, mode, nclass, symmode, rows, cols = _HEADER.unpack_from(mv, 0)
        off = _HEADER.size
        (ntab,) = struct.unpack_from("<H", mv, off)
        off += 2
        if kind not in ITEMSIZE or mode not in (MODE_NONE, MODE_ROWS, MODE_COLS) or ntab > 64:
            raise CorruptError(f"{what}: bad header (dtype {kind}, mode {mode}, table {ntab})")
        n = rows * cols
        if n * ITEMSIZE[kind] != expected_len:
            raise CorruptError(f"{what}: {rows}x{cols} {DTYPE_NAMES[kind]} is not {expected_len} bytes")
        table = np.frombuffer(mv, np.uint8, ntab, off)
        off += ntab
        (nblobs,) = struct.unpack_from("<I", mv, off)
        off += 4
        if nblobs > 3 + 256:
            raise CorruptError(f"{what}: {nblobs} blobs")
        heads = [_BLOB.unpack_from(mv, off + i * _BLOB.size) for i in range(nblobs)]
        off += nblobs * _BLOB.size
    except (struct.error, ValueError):
        raise CorruptError(f"{what}: truncated header") from None
    blobs = []
    for i, (codec, stored, raw_len) in enumerate(heads):
        if off + stored > len(mv) or raw_len > max(expected_len, 1) * 2:
            raise CorruptError(f"{what}: blob {i} runs past the chunk")
        blobs.append((codec, mv[off : off + stored], raw_len))
        off += stored
    if off != len(mv):
        raise CorruptError(f"{what}: {len(mv) - off} trailing bytes")
    return kind, mode, nclass, symmode, rows, cols, table, blobs


def _raw_bits(kind: int, symmode: int, table: np.ndarray, what: str) -> int:
    """Bits of a value's raw field (8, 6 or 0), once the symbol mode and its table fit the dtype."""
    ntab = table.size
    if kind in (BF16, F32):
        if symmode == SYM_WINDOW:
            if ntab != 2 or not 1 <= table[0] or table[1] > 1:
                raise CorruptError(f"{what}: bad exponent window")
        elif symmode == SYM_TABLE:
            if not 0 < ntab <= 64:
                raise CorruptError(f"{what}: bad exponent table of {ntab}")
        elif symmode != SYM_EXP or ntab:
            raise CorruptError(f"{what}: bad symbol mode {symmode}")
        return 8 if symmode == SYM_EXP else 6
    if symmode or ntab:
        raise CorruptError(f"{what}: {DTYPE_NAMES[kind]} has no symbol table")
    return 8 if kind == F16 else 0


def _read_raw_plane(blob: tuple, n: int, raw_bits: int, what: str) -> np.ndarray:
    """The raw field of each of the ``n`` values (uint8; 6-bit fields unpacked)."""
    codec, b, raw_len = blob
    want_len = packed6_len(n) if raw_bits == 6 else n
    if raw_len != want_len:
        raise CorruptError(f"{what}: raw plane of {raw_len} bytes, expected {want_len}")
    raw = np.frombuffer(_read_blob(codec, b, raw_len, what), np.uint8)
    if raw_bits == 6:
        raw = unpack6(raw, n, out=_scratch("draw", n, np.uint8))
    return raw


def _words_from_exponents(sym: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """16-bit words from symbols that are the exponent (bf16) or the exponent + 3 mantissa bits
    (fp16), and raw bytes ``sign<<7 | 7 mantissa bits``."""
    n = sym.size
    w = np.empty(n, _U16)
    t = np.empty(BLOCK, _U16)
    u = np.empty(BLOCK, _U16)
    for i in range(0, n, BLOCK):
        s, r, o = sym[i : i + BLOCK], raw[i : i + BLOCK], w[i : i + BLOCK]
        m = s.size
        np.copyto(u[:m], r)
        np.copyto(t[:m], s)
        np.left_shift(t[:m], 7, out=t[:m])
        np.bitwise_and(u[:m], 0x80, out=o)
        np.left_shift(o, 8, out=o)
        np.bitwise_and(u[:m], 0x7F, out=u[:m])
        np.bitwise_or(o, t[:m], out=o)
        np.bitwise_or(o, u[:m], out=o)
    return w


def _words_from_slots(sym: np.ndarray, raw: np.ndarray, symmode: int, table: np.ndarray, what: str) -> np.ndarray:
    """bf16 words from symbols ``slot<<2 | top 2 mantissa bits`` (the slot read through the
    exponent window or table) and raw fields ``sign<<5 | 5 mantissa bits``."""
    n = sym.size
    base, has_zero = (int(table[0]), int(table[1])) if symmode == SYM_WINDOW else (0, 0)
    if symmode == SYM_TABLE:
        if (int(sym.max()) >> 2 if n else 0) >= table.size:
            raise CorruptError(f"{what}: symbol beyond the exponent table")
        expo_of = np.zeros(64, np.uint8)
        expo_of[: table.size] = table
    # a slot is < 64, so 4 copies of the table make the 256-byte map bytes.translate takes
    expo_tr = (expo_of.tobytes() * 4) if symmode == SYM_TABLE else b""
    zero_fix = symmode == SYM_WINDOW and has_zero and base > 1
    e8 = np.empty(BLOCK, np.uint8)
    m8 = np.empty(BLOCK, np.uint8)
    nz = np.empty(BLOCK, np.bool_)
    w = np.empty(n, _U16)
    t = np.empty(BLOCK, _U16)
    u = np.empty(BLOCK, _U16)
    for i in range(0, n, BLOCK):
        s, r, o = sym[i : i + BLOCK], raw[i : i + BLOCK], w[i : i + BLOCK]
        m = s.size
        np.copyto(u[:m], r)
        e, mm = e8[:m], m8[:m]
        np.right_shift(s, 2, out=e)  # slot
        if symmode == SYM_WINDOW:
            if zero_fix:
                np.not_equal(e, 0, out=nz[:m])
            np.add(e, np.uint8(base - 1), out=e)
            if zero_fix:
                np.multiply(e, nz[:m], out=e)
        else:
            e[:] = np.frombuffer(e.tobytes().translate(expo_tr), np.uint8)
        np.copyto(t[:m], e)
        np.left_shift(t[:m], 2, out=t[:m])
        np.bitwise_and(s, 3, out=mm)
        np.bitwise_or(t[:m], mm, out=t[:m])
        np.left_shift(t[:m], 5, out=t[:m])  # exponent<<7 | top 2 mantissa bits<<5
        np.bitwise_and(u[:m], 0x20, out=o)
        np.left_shift(o, 10, out=o)
        np.bitwise_and(u[:m], 0x1F, out=u[:m])
        np.bitwise_or(o, t[:m], out=o)
        np.bitwise_or(o, u[:m], out=o)
    return w


def _join_low_halves(w: np.ndarray, blob: tuple, what: str) -> np.ndarray:
    """fp32's bytes: the decoded high halves ``w`` joined with the low halves in ``blob``."""
    n = w.size
    codec, b, raw_len = blob
    if raw_len != 2 * n:
        raise CorruptError(f"{what}: low plane of {raw_len} bytes, expected {2 * n}")
    low = np.frombuffer(_read_blob(codec, b, raw_len, what), "<u2")
    out = np.empty(n, "<u4")
    for i in range(0, n, BLOCK):
        o = out[i : i + BLOCK]
        np.copyto(o, w[i : i + BLOCK])
        np.left_shift(o, 16, out=o)
        np.bitwise_or(o, low[i : i + BLOCK], out=o)
    return out.view(np.uint8)


def _decode_symbols(it, mode: int, nclass: int, rows: int, cols: int, what: str) -> np.ndarray:
    """The chunk's symbols in row-major order (a per-thread scratch buffer)."""
    n = rows * cols
    sym = _scratch("dsym", n, np.uint8)
    if mode == MODE_NONE:
        codec, b, raw_len = next(it)
        if raw_len != n:
            raise CorruptError(f"{what}: symbol stream of {raw_len} bytes, expected {n}")
        got = _read_blob(codec, b, raw_len, what, out=sym)
        return sym if got is sym else np.frombuffer(got, np.uint8)
    nlines = rows if mode == MODE_ROWS else cols
    codec, b, raw_len = next(it)
    if raw_len != nlines:
        raise CorruptError(f"{what}: {raw_len} line classes, expected {nlines}")
    cls = np.frombuffer(_read_blob(codec, b, raw_len, what), np.uint8)
    if nlines and int(cls.max()) >= nclass:
        raise CorruptError(f"{what}: line class out of range")
    perm = np.argsort(cls, kind="stable")
    counts = np.bincount(cls, minlength=nclass)
    ends = np.cumsum(counts)
    width = cols if mode == MODE_ROWS else rows
    out = sym.reshape(rows, cols)
    ordered = _scratch("dord", n, np.uint8).reshape(rows, cols) if mode == MODE_COLS else None
    for c in range(nclass):
        codec, b, raw_len = next(it)
        if raw_len != counts[c] * width:
            raise CorruptError(f"{what}: class {c} stream of {raw_len} bytes, expected {counts[c] * width}")
        if not raw_len:
            continue
        s = _read_blob(codec, b, raw_len, what, out=_scratch("dzs", raw_len, np.uint8))
        s = np.frombuffer(s, np.uint8) if not isinstance(s, np.ndarray) else s
        if mode == MODE_ROWS:
            out[perm[ends[c] - counts[c] : ends[c]]] = s.reshape(-1, cols)
        else:
            ordered[:, ends[c] - counts[c] : ends[c]] = s.reshape(rows, -1)
    if mode == MODE_COLS:
        np.take(ordered, np.argsort(perm), axis=1, out=out)
    return sym
