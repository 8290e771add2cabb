"""The .glyd file archive: byte-exact round trips of files and folders, and clear rejection of
corrupt, truncated and foreign archives."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import glyd.filecodec as fc
from glyd.errors import CorruptError, DestinationExistsError, FormatError, GlydError
from glyd.filecodec import archive as arc
from glyd.filecodec import plan


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def tensors(seed: int = 0, rows: int = 300, cols: int = 256) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * 0.02
    return {
        "bf16": w.to(torch.bfloat16),
        "fp16": w.to(torch.float16),
        "fp32": w.clone(),
        "e4m3": w.mul(20).to(torch.float8_e4m3fn),
        "e5m2": w.to(torch.float8_e5m2),
        "ints": torch.arange(1000, dtype=torch.int64),
        "mask": torch.ones(7, dtype=torch.bool),
        "f64": torch.randn(11, generator=g, dtype=torch.float64),
        "scalar": torch.tensor(1.5, dtype=torch.bfloat16),
        "empty": torch.zeros(0, 4, dtype=torch.bfloat16),
        "conv": torch.randn(16, 8, 3, generator=g).to(torch.bfloat16),
    }


def write_st(path: Path, seed: int = 0, **kw) -> Path:
    save_file(tensors(seed, **kw), str(path), metadata={"format": "pt"})
    return path


def roundtrip_bytes(data: bytes, name: str = "data") -> bytes:
    blob = fc.compress_bytes(data, name)
    assert blob[:8] == fc.MAGIC
    out = fc.decompress_bytes(blob)
    assert out == data
    return blob


@pytest.mark.parametrize("data", [b"", b"x", b"\0" * 9, b"{" * 20, bytes(range(256)) * 3])
def test_empty_tiny_and_odd_bytes(data):
    roundtrip_bytes(data)


def test_non_model_bytes_shrink():
    text = ("To be, or not to be, that is the question. " * 2000).encode()
    blob = roundtrip_bytes(text, "play.txt")
    assert len(blob) < len(text) / 20


def test_safetensors_every_dtype(tmp_path):
    p = write_st(tmp_path / "m.safetensors")
    data = p.read_bytes()
    blob = roundtrip_bytes(data, "m.safetensors")
    assert len(blob) < len(data)  # the float tensors were entropy coded, not stored


def test_safetensors_floats_are_coded_by_dtype(tmp_path):
    pieces = plan.plan_file(*_src(write_st(tmp_path / "m.safetensors")))
    coded = {(p.dtype, p.cols) for p in pieces if p.dtype}
    from glyd.filecodec import floats as F

    assert {F.BF16, F.F16, F.F32, F.F8_E4M3, F.F8_E5M2} <= {d for d, _ in coded}
    assert (F.BF16, 3) in coded  # conv weight: rows of its last dim


def _src(p: Path):
    data = p.read_bytes()
    return len(data), lambda off, n: data[off : off + n]


def test_large_tensor_is_cut_into_row_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(plan, "CHUNK_BYTES", 64 << 10)
    p = tmp_path / "big.safetensors"
    g = torch.Generator().manual_seed(1)
    save_file({"w": (torch.randn(1000, 300, generator=g) * 0.02).to(torch.bfloat16), "v": torch.randn(70000, generator=g).to(torch.float16)}, str(p))
    pieces = plan.plan_file(*_src(p))
    assert sum(1 for x in pieces if x.dtype) > 6 and max(x.length for x in pieces) <= 64 << 10
    r = fc.compress_files([p], tmp_path / "big.glyd", jobs=2)
    assert r.chunks == len(pieces)
    fc.decompress(tmp_path / "big.glyd", tmp_path / "out", jobs=2)
    assert (tmp_path / "out" / "big.safetensors").read_bytes() == p.read_bytes()


@pytest.mark.parametrize(
    "header",
    [
        b'{"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,999]}}',  # past the end
        b'{"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,6]}}',  # size mismatch
        b'{"a":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[4],"data_offsets":[4,12]}}',
        b'{"w":{"dtype":"BF16","shape":[-4],"data_offsets":[0,8]}}',
        b'{"w":[1,2]}',
        b"{not json",
        b'{"w":{"dtype":"BF16","shape":[4],"data_offsets":[true,8]}}',
    ],
)
def test_hostile_safetensors_headers_still_roundtrip(header):
    data = struct.pack("<Q", len(header)) + header + bytes(range(16))
    roundtrip_bytes(data, "evil.safetensors")
    huge = struct.pack("<Q", 1 << 62) + b"{" + b"\0" * 40
    roundtrip_bytes(huge, "huge.safetensors")


def sharded_folder(root: Path) -> Path:
    model = root / "model"
    (model / "sub").mkdir(parents=True)
    write_st(model / "model-00001-of-00002.safetensors", seed=1)
    write_st(model / "model-00002-of-00002.safetensors", seed=2, rows=40, cols=96)
    index = {"metadata": {"total_size": 1}, "weight_map": {"bf16": "model-00001-of-00002.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "empty.txt").write_bytes(b"")
    (model / "sub" / "tokenizer.bin").write_bytes(os.urandom(3000))
    return model


@pytest.mark.parametrize("jobs", [1, 2])
def test_sharded_model_folder(tmp_path, jobs):
    model = sharded_folder(tmp_path)
    archive = tmp_path / "model.glyd"
    rep = fc.compress_files([model], archive, jobs=jobs)
    names = sorted(e.path for e in rep.entries)
    assert names == sorted(
        [
            "model/config.json",
            "model/empty.txt",
            "model/model-00001-of-00002.safetensors",
            "model/model-00002-of-00002.safetensors",
            "model/model.safetensors.index.json",
            "model/sub/tokenizer.bin",
        ]
    )
    assert [e.path for e in fc.list_entries(archive)] == [e.path for e in rep.entries]
    t = fc.test(archive, jobs=jobs)
    assert t.original_bytes == rep.original_bytes and t.archive_bytes == archive.stat().st_size
    out = tmp_path / "out"
    fc.decompress(archive, out, jobs=jobs)
    for f in model.rglob("*"):
        if f.is_file():
            assert sha(out / "model" / f.relative_to(model)) == sha(f), f
    assert not list(out.rglob("*.tmp"))


def test_never_overwrites(tmp_path):
    (tmp_path / "a.txt").write_text("a")
    archive = tmp_path / "a.glyd"
    fc.compress_files([tmp_path / "a.txt"], archive)
    with pytest.raises(DestinationExistsError):
        fc.compress_files([tmp_path / "a.txt"], archive)
    with pytest.raises(DestinationExistsError):
        fc.decompress(archive, tmp_path)  # a.txt is there
    assert (tmp_path / "a.txt").read_text() == "a"


def test_duplicate_names_rejected(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    (tmp_path / "x" / "a.txt").write_text("1")
    (tmp_path / "y" / "a.txt").write_text("2")
    with pytest.raises(Exception, match="same name"):
        fc.compress_files([tmp_path / "x" / "a.txt", tmp_path / "y" / "a.txt"], tmp_path / "o.glyd")
    assert not (tmp_path / "o.glyd").exists()


# ----------------------------------------------------------------------------- damaged archives


@pytest.fixture
def two_file_archive(tmp_path) -> tuple[Path, bytes]:
    write_st(tmp_path / "m.safetensors", seed=3, rows=2000)
    (tmp_path / "notes.txt").write_text("hello\n" * 1000)
    archive = tmp_path / "two.glyd"
    fc.compress_files([tmp_path / "notes.txt", tmp_path / "m.safetensors"], archive)
    return archive, archive.read_bytes()


def chunk_offsets(blob: bytes) -> list[tuple[int, int, int, int]]:
    """(file, chunk, payload offset, payload length) of every chunk record."""
    _, _, _, tlen = arc._HEAD.unpack_from(blob, 0)
    pos = arc._HEAD.size + tlen + 4
    out = []
    while blob[pos : pos + 1] != b"Z":
        if blob[pos : pos + 1] == b"E":
            pos += arc._END.size
            continue
        _, fi, ci, _, _, plen, _ = arc._CHUNK.unpack_from(blob, pos)
        out.append((fi, ci, pos + arc._CHUNK.size, plen))
        pos += arc._CHUNK.size + plen
    return out


def assert_rejected(tmp_path, blob: bytes, exc, match: str, in_memory: bool = True):
    bad = tmp_path / "bad.glyd"
    bad.write_bytes(blob)
    with pytest.raises(exc, match=match):
        fc.test(bad)
    out = tmp_path / "out_bad"
    out.mkdir(exist_ok=True)
    with pytest.raises(exc, match=match):
        fc.decompress(bad, out)
    assert list(out.rglob("*")) == []  # nothing half-written
    if in_memory:  # decompress_bytes takes one-file archives only
        with pytest.raises(exc, match=match):
            fc.decompress_bytes(blob)


def test_corrupt_chunk_named(tmp_path, two_file_archive):
    archive, blob = two_file_archive
    offs = chunk_offsets(blob)
    fi, ci, off, plen = [o for o in offs if o[0] == 1][3]
    bad = bytearray(blob)
    bad[off + plen // 2] ^= 0x10
    assert_rejected(tmp_path, bytes(bad), CorruptError, rf"m\.safetensors'? chunk {ci}: checksum mismatch", in_memory=False)


def test_corrupt_file_table(tmp_path, two_file_archive):
    _, blob = two_file_archive
    bad = bytearray(blob)
    bad[arc._HEAD.size + 5] ^= 1
    assert_rejected(tmp_path, bytes(bad), CorruptError, "file table checksum", in_memory=False)


@pytest.mark.parametrize("cut", [4, 17, 40, 0.3, 0.7, -40, -1])
def test_truncated(tmp_path, two_file_archive, cut):
    _, blob = two_file_archive
    n = int(len(blob) * cut) if isinstance(cut, float) else (cut if cut > 0 else len(blob) + cut)
    assert_rejected(tmp_path, blob[:n], CorruptError, "truncated|end marker", in_memory=False)


def test_trailing_garbage(tmp_path, two_file_archive):
    _, blob = two_file_archive
    assert_rejected(tmp_path, blob + b"junk", CorruptError, "after the end marker", in_memory=False)


# the zstd frame's body fixed (random bytes as a parameter collect differently in each pytest-xdist worker)
@pytest.mark.parametrize("blob", [b"", b"PK\x03\x04" + b"\0" * 100, b"\x28\xb5\x2f\xfd" + bytes(range(7, 199, 3)),
                                  b"GLYDZIP\0..."], ids=["empty", "zip", "zstd", "glydzip-magic"])
def test_foreign_files(tmp_path, blob):
    assert_rejected(tmp_path, blob, FormatError, "not a glyd archive")


def test_future_version(tmp_path, two_file_archive):
    _, blob = two_file_archive
    bad = bytearray(blob)
    struct.pack_into("<H", bad, 8, 2)
    assert_rejected(tmp_path, bytes(bad), FormatError, "version 2", in_memory=False)


def craft(entries: list[dict], records: bytes = b"", nfiles: int | None = None) -> bytes:
    table = json.dumps({"files": entries}).encode()
    head = arc._HEAD.pack(fc.MAGIC, fc.VERSION, 0, len(table)) + table + struct.pack("<I", zlib.crc32(table))
    return head + records + arc._TAIL.pack(b"Z", len(entries) if nfiles is None else nfiles, fc.MAGIC)


@pytest.mark.parametrize("path", ["../evil", "/etc/passwd", "a/../../b", "a\\b", "", "a//b", "./a"])
def test_unsafe_paths_rejected(tmp_path, path):
    blob = craft([{"path": path, "size": 0}], arc._END.pack(b"E", 0, 0, hashlib.sha256().digest()))
    assert_rejected(tmp_path, blob, FormatError, "file name")


def test_hostile_sizes_rejected(tmp_path):
    # a chunk that claims 1 GiB: refused before anything is allocated
    rec = arc._CHUNK.pack(b"C", 0, 0, arc.CODEC_STORE, 1 << 30, 1 << 30, 0)
    blob = craft([{"path": "a", "size": 1 << 30}], rec)
    assert_rejected(tmp_path, blob, CorruptError, "out of bounds")
    # a chunk larger than its file
    rec = b"".join(arc._record(0, 0, arc.CODEC_STORE, 10, b"0123456789"))
    blob = craft([{"path": "a", "size": 5}], rec)
    assert_rejected(tmp_path, blob, CorruptError, "past the file size")


def test_wrong_hash_detected(tmp_path):
    rec = b"".join(arc._record(0, 0, arc.CODEC_STORE, 3, b"abc"))
    blob = craft([{"path": "a", "size": 3}], rec + arc._END.pack(b"E", 0, 1, hashlib.sha256(b"abd").digest()))
    assert_rejected(tmp_path, blob, CorruptError, "sha256 mismatch")
    good = craft([{"path": "a", "size": 3}], rec + arc._END.pack(b"E", 0, 1, hashlib.sha256(b"abc").digest()))
    assert fc.decompress_bytes(good) == b"abc"


def test_decompress_bytes_needs_one_file(tmp_path, two_file_archive):
    _, blob = two_file_archive
    with pytest.raises(FormatError, match="more than one file"):
        fc.decompress_bytes(blob)


def test_memory_bounded_by_chunks_not_file(tmp_path, monkeypatch):
    import tracemalloc

    monkeypatch.setattr(plan, "CHUNK_BYTES", 64 << 10)
    p = tmp_path / "big.safetensors"
    g = torch.Generator().manual_seed(7)
    save_file({"w": (torch.randn(4096, 512, generator=g) * 0.02).to(torch.bfloat16)}, str(p))  # 4 MiB
    (tmp_path / "blob.bin").write_bytes(os.urandom(3 << 20))
    archive = tmp_path / "big.glyd"
    for jobs in (1, 2):
        archive.unlink(missing_ok=True)
        tracemalloc.start()
        fc.compress_files([p, tmp_path / "blob.bin"], archive, jobs=jobs)
        peak_c = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        tracemalloc.start()
        fc.test(archive, jobs=jobs)
        peak_t = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        # a few 64 KiB chunks in flight (2 * jobs) plus per-thread scratch: far below the 7 MiB of input
        assert peak_c < 2 << 20 and peak_t < 2 << 20, (jobs, peak_c, peak_t)


def test_file_and_folder_of_one_name_rejected(tmp_path):
    end = arc._END.pack(b"E", 0, 0, hashlib.sha256().digest())
    end1 = arc._END.pack(b"E", 1, 0, hashlib.sha256().digest())
    blob = craft([{"path": "a", "size": 0}, {"path": "a/b", "size": 0}], end + end1)
    assert_rejected(tmp_path, blob, FormatError, "which is a file", in_memory=False)


@pytest.mark.parametrize(
    "table",
    [b"[" * 100000 + b"]" * 100000, b'{"files": [1, 2]}', b'{"files": {"a": 1}}', b'{"files": [{"path": "a", "size": -1}]}', b"\xff\xfe"],
)
def test_hostile_file_tables(tmp_path, table):
    head = arc._HEAD.pack(fc.MAGIC, fc.VERSION, 0, len(table)) + table + struct.pack("<I", zlib.crc32(table))
    assert_rejected(tmp_path, head + arc._TAIL.pack(b"Z", 0, fc.MAGIC), CorruptError, "bad file table")


def test_fuzzed_payloads_with_valid_crc_are_corrupt_errors(tmp_path):
    """Damage that passes the CRC (a crafted archive) must still end in CorruptError."""
    import random

    p = tmp_path / "m.safetensors"
    g = torch.Generator().manual_seed(9)
    rows = torch.randn(300, 256, generator=g) * torch.logspace(-4, 0, 300)[:, None]
    save_file(
        {"b": rows.to(torch.bfloat16), "h": rows.to(torch.float16), "f": rows[:40], "q": rows.to(torch.float8_e4m3fn)},
        str(p),
    )
    blob = fc.compress_bytes(p.read_bytes(), "m.safetensors")
    offs = chunk_offsets(blob)
    rng = random.Random(0)
    for trial in range(150):
        fi, ci, off, plen = rng.choice(offs)
        bad = bytearray(blob)
        for _ in range(rng.choice([1, 1, 2, 8])):
            pos = off + (rng.randrange(min(plen, 64)) if rng.random() < 0.6 else rng.randrange(plen))
            bad[pos] ^= rng.randrange(1, 256)
        head_at = off - arc._CHUNK.size
        crc = zlib.crc32(bytes(bad[off : off + plen]), zlib.crc32(bytes(bad[head_at : head_at + arc._CHUNK.size - 4])))
        struct.pack_into("<I", bad, head_at + arc._CHUNK.size - 4, crc)
        with pytest.raises(CorruptError, match=f"chunk {ci}|sha256 mismatch"):
            fc.decompress_bytes(bytes(bad))


@pytest.mark.parametrize("cut", [1, 23, 30, 60])
def test_truncated_with_braces_in_the_name(tmp_path, cut):
    # the reader formats its "truncated" message only on error: a name like "{0}" must not break it
    blob = fc.compress_bytes(b"abc" * 100, "w{0}{x}.txt")
    assert_rejected(tmp_path, blob[: len(blob) - cut], CorruptError, r"truncated|end marker")


def test_many_files_across_one_pool(tmp_path, monkeypatch):
    # one thread pool serves the whole archive: files of 0, 1 and several chunks, in order
    monkeypatch.setattr(plan, "CHUNK_BYTES", 256)
    (tmp_path / "in").mkdir()
    for i in range(40):
        (tmp_path / "in" / f"f{i:02d}").write_bytes(os.urandom(i % 3) * (i * 20))
    for jobs in (1, 2, 3):
        archive = tmp_path / f"a{jobs}.glyd"
        rep = fc.compress_files([tmp_path / "in"], archive, jobs=jobs)
        assert rep.chunks > 40
        assert fc.test(archive, jobs=jobs).original_bytes == sum(f.stat().st_size for f in (tmp_path / "in").iterdir())
        out = tmp_path / f"out{jobs}"
        fc.decompress(archive, out, jobs=jobs)
        for f in (tmp_path / "in").iterdir():
            assert (out / "in" / f.name).read_bytes() == f.read_bytes()


@pytest.fixture
def few_fds():
    """A soft limit of 40 file descriptors above those open now (restored after the test)."""
    resource = pytest.importorskip("resource")
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 40, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("jobs", [1, 2])
def test_more_files_than_file_descriptors(tmp_path, few_fds, jobs):
    # compress opens each input only while its chunks are read, not all of them at once
    src = tmp_path / "many"
    src.mkdir()
    for i in range(300):
        (src / f"f{i:03d}.txt").write_text(f"file {i} " * (i % 7))
    archive = tmp_path / "many.glyd"
    assert len(fc.compress_files([src], archive, jobs=jobs).entries) == 300
    fc.decompress(archive, tmp_path / "out", jobs=jobs)
    for f in src.iterdir():
        assert (tmp_path / "out" / "many" / f.name).read_bytes() == f.read_bytes()


def test_input_changed_between_listing_and_reading(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_text("a" * 100)
    (tmp_path / "b.txt").write_text("b" * 100)
    plan_file = plan.plan_file

    def grow_b(size, read):  # b.txt grows once a.txt is being read, after the table was made
        with open(tmp_path / "b.txt", "a") as f:
            f.write("more")
        return plan_file(size, read)

    monkeypatch.setattr(arc, "plan_file", grow_b)
    with pytest.raises(GlydError, match=r"b\.txt: changed while being compressed"):
        fc.compress_files([tmp_path / "a.txt", tmp_path / "b.txt"], tmp_path / "ab.glyd")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]
