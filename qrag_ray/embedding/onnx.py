"""ONNX Runtime for the transformer inside a sentence-transformers model, on CPU, where it runs the forward
pass faster than torch with the same vectors (docs/BENCHMARKS.md). Only the forward pass moves (tokenising,
pooling, normalising stay sentence-transformers'), so the indexes do not change. The graph is exported once
per model into ~/.cache/qrag/onnx/ (`QRAG_ONNX_CACHE`), through a temporary file renamed into place; a probe
is encoded both ways first, and a model whose export disagrees stays on torch.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import uuid
import warnings
from functools import partial
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

_PROBE = ["How long can a flea live without a host?", "Ships sail on the sea."]
_MAX_PROBE_DIFF = 1e-4
_OPSET = 17


class OnnxUnavailable(RuntimeError):
    """Why this model cannot run on ONNX Runtime here (the caller decides: fall back or fail)."""


def _graph_key(src, names: list[str]) -> str:
    """Which exported graph fits this model: its weights' folder, sizes and times, and the exporter."""
    import onnxruntime
    import torch

    parts = [torch.__version__, onnxruntime.__version__, str(_OPSET), ",".join(names)]
    folder = Path(str(getattr(src.config, "_name_or_path", "") or ""))
    if not folder.is_dir():  # models load from local folders (qrag_ray.models.bundled)
        raise OnnxUnavailable(f"no model folder to key the exported graph by ({folder})")
    for file in sorted(folder.glob("*")):
        if file.is_file() and file.suffix in (".safetensors", ".bin", ".json"):
            parts.append(f"{file.resolve()}:{file.stat().st_size}:{int(file.stat().st_mtime)}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _export(model, names: list[str], path: Path) -> None:
    import torch

    class _Hidden(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, *args):
            return self.model(**dict(zip(names, args, strict=True)), return_dict=True).last_hidden_state

    ids = torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]], dtype=torch.long)
    dummy = {"input_ids": ids, "attention_mask": (ids != 0).long(), "token_type_ids": torch.zeros_like(ids)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{uuid.uuid4().hex[:8]}.tmp")
    axes = {n: {0: "batch", 1: "tokens"} for n in [*names, "last_hidden_state"]}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(_Hidden(model).eval(), tuple(dummy[n] for n in names), str(tmp),
                              input_names=names, output_names=["last_hidden_state"], dynamic_axes=axes,
                              opset_version=_OPSET, dynamo=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class _OrtModel:
    """Stands in for the Hugging Face model: same call, same `last_hidden_state`, ONNX Runtime inside;
    anything else (its config, dtype, ...) is read from the torch model it replaces."""

    def __init__(self, session, names: list[str], torch_model):
        self.session = session
        self.names = names
        self.torch_model = torch_model

    def __getattr__(self, name: str):
        return getattr(self.__dict__["torch_model"], name)

    def forward(self, **inputs):
        import torch
        from transformers.modeling_outputs import BaseModelOutput

        if "token_type_ids" in self.names and inputs.get("token_type_ids") is None:
            inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
        feeds = {n: inputs[n].detach().cpu().numpy().astype(np.int64, copy=False) for n in self.names}
        out = self.session.run(None, feeds)[0]
        return BaseModelOutput(last_hidden_state=torch.from_numpy(out))

    __call__ = forward


def use_onnx(model, threads: int | None = None) -> None:
    """Run `model`'s transformer on ONNX Runtime from now on (raises OnnxUnavailable, `model` unchanged)."""
    try:
        import onnxruntime as ort
        import torch
    except ImportError as error:
        raise OnnxUnavailable(f"onnxruntime is not installed ({error}); pip install 'qrag-ray[cpu]'") from None
    first = model[0]  # the Hugging Face encoder is its `model` (or, in older releases, `auto_model`)
    attr = "model" if getattr(first, "model", None) is not None else "auto_model"
    torch_model = getattr(first, attr, None)
    if torch_model is None or not hasattr(torch_model, "config") or getattr(model, "tokenizer", None) is None:
        raise OnnxUnavailable("the model's first module is not a transformer encoder")
    if str(getattr(model, "device", "cpu")) != "cpu":
        raise OnnxUnavailable("the ONNX backend runs on CPU only")
    params = set(inspect.signature(torch_model.forward).parameters)
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in params]
    if names[:2] != ["input_ids", "attention_mask"]:
        raise OnnxUnavailable(f"unexpected model inputs {sorted(params)[:8]}")
    cache = Path(os.environ.get("QRAG_ONNX_CACHE") or Path.home() / ".cache" / "qrag" / "onnx")
    path = cache / f"{type(torch_model).__name__}-{_graph_key(torch_model, names)}.onnx"
    if not path.is_file():
        try:
            import onnx  # noqa: F401 - torch's exporter imports it: here its absence is one clear error
        except ImportError as error:
            raise OnnxUnavailable(f"exporting needs the onnx package ({error})") from None
        logger.info("exporting %s to ONNX: %s", type(torch_model).__name__, path)
        try:
            _export(torch_model, names, path)
        except Exception as error:  # an architecture the exporter cannot trace
            raise OnnxUnavailable(f"ONNX export failed: {type(error).__name__}: {error}") from None
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(threads or torch.get_num_threads())
    options.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:
        raise OnnxUnavailable(f"ONNX Runtime cannot load {path}: {error}") from None
    probe = partial(model.encode, _PROBE, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    want = probe()
    # the torch model leaves the module tree (the stand-in keeps it for its config): sentence-transformers
    # walks every module, parameter and buffer on each encode call (eval(), its device check), Python work
    # with no use for a model ONNX Runtime runs; `model.device` then falls back to the CPU, the only device this
    # backend runs on. An instance attribute is found before nn.Module's
    # submodule lookup, so a plain callable stands in for the model.
    del first._modules[attr]
    object.__setattr__(first, attr, _OrtModel(session, names, torch_model))
    try:
        diff = float(np.abs(np.asarray(want) - np.asarray(probe())).max())
        why = None if diff <= _MAX_PROBE_DIFF else f"ONNX vectors differ from torch's by {diff:.2e} on a probe sentence"
    except Exception as error:
        why = f"ONNX Runtime failed on a probe sentence: {type(error).__name__}: {error}"
    if why:
        object.__delattr__(first, attr)
        first._modules[attr] = torch_model
        raise OnnxUnavailable(why)
    model._qrag_backend = "onnx"


def backend_of(model) -> str:
    return getattr(model, "_qrag_backend", "torch")
