"""Preparing the bundled Qwen model: parts verified by size and sha256, converted once, reused.

The real conversion (dequantising 491 MB of GGUF into a 1 GB HF folder) takes minutes, so the
assemble -> verify -> convert -> publish -> reuse logic runs here on small part files with a stand-in
converter (through `ensure_qwen_hf`'s parameters); the checksum check also runs on the real parts, and
reuse on the real cached folder.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
import time
from pathlib import Path

import pytest

from llm_stack import missing, qwen_converted
from qrag_ray.errors import QragError
from qrag_ray.models import qwen


def _parts(tmp_path: Path, count: int = 3) -> tuple[list[Path], str, list[int]]:
    parts = []
    hasher = hashlib.sha256()
    for i in range(count):
        path = tmp_path / "pkg" / f"part{i + 1:02d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = bytes([i]) * (1000 + i) + f"part {i}".encode()
        path.write_bytes(data)
        hasher.update(data)
        parts.append(path)
    return parts, hasher.hexdigest(), [p.stat().st_size for p in parts]


class Converter:
    """Stands in for the transformers dequantisation: checks it gets the assembled GGUF, writes a folder."""

    def __init__(self, want_sha: str):
        self.want_sha = want_sha
        self.calls = 0

    def __call__(self, gguf: Path, out_dir: Path) -> None:
        self.calls += 1
        assert hashlib.sha256(gguf.read_bytes()).hexdigest() == self.want_sha
        (out_dir / "config.json").write_text(json.dumps({"model_type": "qwen2"}))


def test_prepare_once_then_reuse(tmp_path):
    parts, sha, sizes = _parts(tmp_path)
    conv = Converter(sha)
    options = dict(parts=parts, expected_sha256=sha, expected_sizes=sizes, convert=conv)
    folder = qwen.ensure_qwen_hf(tmp_path / "cache", **options)
    assert folder == qwen.qwen_hf_dir(tmp_path / "cache", sha) and folder.name.endswith(sha[:12])
    assert conv.calls == 1
    assert (folder / "config.json").is_file() and not (folder / "_gguf").exists()  # the 491 MB GGUF is not kept
    meta = json.loads((folder / qwen.MARKER_FILE).read_text())
    assert meta["gguf_sha256"] == sha
    # nothing left behind but the published folder (and its lock file)
    assert sorted(p.name for p in folder.parent.iterdir() if not p.name.endswith(".lock")) == [folder.name]

    started = time.perf_counter()
    again = qwen.ensure_qwen_hf(tmp_path / "cache", **options)
    assert again == folder and conv.calls == 1  # reused, not converted again
    assert time.perf_counter() - started < 0.5
    # the parts are not even read on reuse
    for part in parts:
        part.unlink()
    assert qwen.ensure_qwen_hf(tmp_path / "cache", **options) == folder and conv.calls == 1


def test_corrupt_part_is_rejected_and_nothing_is_published(tmp_path):
    parts, sha, sizes = _parts(tmp_path)
    data = bytearray(parts[1].read_bytes())
    data[10] ^= 0xFF  # same size, one flipped byte
    parts[1].write_bytes(bytes(data))
    conv = Converter(sha)
    with pytest.raises(QragError, match="model checksum mismatch: .* a part is corrupt"):
        qwen.ensure_qwen_hf(tmp_path / "cache", parts=parts, expected_sha256=sha, expected_sizes=sizes, convert=conv)
    assert conv.calls == 0
    models = tmp_path / "cache" / "models"
    assert not qwen.qwen_hf_dir(tmp_path / "cache", sha).exists()
    assert [p.name for p in models.iterdir() if not p.name.endswith(".lock")] == []  # temp build dir removed


def test_truncated_or_missing_part_is_rejected_before_reading(tmp_path):
    parts, sha, sizes = _parts(tmp_path)
    parts[2].write_bytes(parts[2].read_bytes()[:-5])
    with pytest.raises(QragError, match=r"part03.bin has \d+ bytes, expected \d+: it is truncated"):
        qwen.assemble_gguf(parts, tmp_path / "x.gguf", sha, sizes)
    assert not (tmp_path / "x.gguf").exists()
    parts[0].unlink()
    with pytest.raises(QragError, match="model part file\\(s\\) missing: .*part01.bin"):
        qwen.assemble_gguf(parts, tmp_path / "x.gguf", sha, sizes)


def test_failed_conversion_publishes_nothing_and_a_retry_converts(tmp_path):
    parts, sha, sizes = _parts(tmp_path)

    def broken(gguf, out_dir):
        (out_dir / "config.json").write_text("{}")
        raise RuntimeError("killed mid-conversion")

    options = dict(parts=parts, expected_sha256=sha, expected_sizes=sizes)
    with pytest.raises(RuntimeError, match="killed"):
        qwen.ensure_qwen_hf(tmp_path / "cache", convert=broken, **options)
    assert not qwen.qwen_hf_dir(tmp_path / "cache", sha).exists()
    conv = Converter(sha)
    assert qwen.ensure_qwen_hf(tmp_path / "cache", convert=conv, **options).is_dir() and conv.calls == 1


def test_concurrent_prepares_convert_once(tmp_path):
    parts, sha, sizes = _parts(tmp_path)
    conv = Converter(sha)

    def slow(gguf, out_dir):
        time.sleep(0.3)
        conv(gguf, out_dir)

    results = []
    threads = [threading.Thread(target=lambda: results.append(qwen.ensure_qwen_hf(
        tmp_path / "cache", parts=parts, expected_sha256=sha, expected_sizes=sizes, convert=slow))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1 and conv.calls == 1


# ---- the real bundled parts and the real cached folder --------------------------------------------------

def _real_parts() -> list[Path]:
    try:
        return qwen.find_qwen_parts()
    except QragError as error:
        missing(str(error))


@pytest.mark.slow  # hashes and writes the real 491 MB twice: ~5-25 s on 2 busy cores
def test_real_parts_match_the_pinned_checksum_and_a_corrupt_copy_is_rejected(tmp_path):
    parts = _real_parts()
    assert [p.stat().st_size for p in parts] == list(qwen.QWEN_PART_SIZES)
    # a corrupted copy of the last part (same size) in tmp_path, the other five real
    bad = tmp_path / parts[-1].name
    shutil.copyfile(parts[-1], bad)
    with open(bad, "r+b") as file:
        file.seek(1234)
        first_byte = file.read(1)
        file.seek(1234)
        file.write(bytes([first_byte[0] ^ 0x01]))
    dest = tmp_path / "joined.gguf"
    with pytest.raises(QragError, match=f"model checksum mismatch: .* expected {qwen.QWEN_GGUF_SHA256}"):
        qwen.assemble_gguf([*parts[:-1], bad], dest, qwen.QWEN_GGUF_SHA256, qwen.QWEN_PART_SIZES)
    assert not dest.exists()
    # the genuine parts join to exactly the pinned GGUF
    assert qwen.assemble_gguf(parts, dest, qwen.QWEN_GGUF_SHA256, qwen.QWEN_PART_SIZES) == qwen.QWEN_GGUF_SHA256
    assert dest.read_bytes()[:4] == b"GGUF"


def test_real_cached_folder_is_reused_without_converting(monkeypatch):
    if not qwen_converted():
        missing("the bundled Qwen is not converted on this machine yet (qrag prepare-models)")

    def refuse(*args, **kwargs):
        raise AssertionError("must not run on reuse")

    monkeypatch.setattr(qwen, "convert_gguf_to_hf", refuse)
    monkeypatch.setattr(qwen, "find_qwen_parts", refuse)
    started = time.perf_counter()
    folder = qwen.ensure_qwen_hf()
    assert time.perf_counter() - started < 0.5
    assert (folder / "config.json").is_file() and (folder / qwen.MARKER_FILE).is_file()
    from qrag_ray.models.bundled import resolve_llm

    assert resolve_llm("qwen2.5-coder-0.5b-instruct") == str(folder)
