"""The ONNX Runtime embedder backend: the same vectors as torch (so indexes built either way agree and
a build resumed on the other backend stays valid), the graph cached once per model, the backend left
out of an index's identity, and a clear error where it cannot run."""

from __future__ import annotations

import numpy as np
import pytest

from qrag_ray.config.index import IndexConfig, index_identity
from qrag_ray.embedding import encode, encode_canonical, load_sentence_transformer
from qrag_ray.embedding.onnx import backend_of
from qrag_ray.errors import QragError

TEXTS = ["what is a python generator expression", "Ships sail on the sea.",
         "A flea can live up to a year, but its general lifespan depends on its living conditions, such as "
         "the availability of hosts. " * 12,  # past max_seq_length: truncated the same way
         "", "naïve café — 東京 2024"]


@pytest.fixture(scope="module")
def torch_minilm():
    return load_sentence_transformer("all-MiniLM-L6-v2", device="cpu", backend="torch")


@pytest.mark.integration
def test_auto_runs_minilm_on_onnx_with_torchs_vectors(minilm, torch_minilm):
    assert backend_of(minilm) == "onnx" and backend_of(torch_minilm) == "torch"
    for encoder in (encode, encode_canonical):
        torch_vecs = encoder(torch_minilm, TEXTS)
        onnx_vecs = encoder(minilm, TEXTS)
        assert torch_vecs.shape == onnx_vecs.shape == (len(TEXTS),
                                                       384) and torch_vecs.dtype == onnx_vecs.dtype == np.float32
        assert np.abs(torch_vecs - onnx_vecs).max() < 1e-5
        assert np.allclose(np.linalg.norm(onnx_vecs, axis=1), 1.0, atol=1e-5)
    # the rank of a query's nearest text is the backend's business no more
    torch_query = encode(torch_minilm, ["how long do fleas live"])
    onnx_query = encode(minilm, ["how long do fleas live"])
    docs = encode(torch_minilm, TEXTS)
    assert int(np.argmax(docs @ torch_query[0])) == int(np.argmax(docs @ onnx_query[0])) == 2


def test_graph_is_exported_once_per_model(tmp_path, monkeypatch):
    from benchmarks.harness.models import write_tiny_model

    monkeypatch.setenv("QRAG_ONNX_CACHE", str(tmp_path / "cache"))
    model = write_tiny_model(tmp_path / "tiny", hidden=32, layers=1)
    first = load_sentence_transformer(str(model), device="cpu", backend="onnx")
    graphs = list((tmp_path / "cache").glob("*.onnx"))
    assert backend_of(first) == "onnx" and len(graphs) == 1
    mtime = graphs[0].stat().st_mtime_ns
    second = load_sentence_transformer(str(model), device="cpu", backend="onnx")
    assert [g.stat().st_mtime_ns for g in (tmp_path / "cache").glob("*.onnx")] == [mtime]
    ref = load_sentence_transformer(str(model), device="cpu", backend="torch")
    assert np.abs(encode(second, TEXTS) - encode(ref, TEXTS)).max() < 1e-5
    assert not list((tmp_path / "cache").glob(".*tmp"))  # no half-written file left behind


def test_onnx_where_it_cannot_run_is_a_clear_error(monkeypatch):
    import qrag_ray.embedding.onnx as onnx_backend

    def no_runtime(*args, **kwargs):
        raise onnx_backend.OnnxUnavailable("onnxruntime is not installed (test)")

    monkeypatch.setattr(onnx_backend, "use_onnx", no_runtime)
    with pytest.raises(QragError, match="embedder backend onnx: onnxruntime is not installed"):
        load_sentence_transformer("all-MiniLM-L6-v2", device="cpu", backend="onnx")
    model = load_sentence_transformer("all-MiniLM-L6-v2", device="cpu", backend="auto")  # auto falls back
    assert backend_of(model) == "torch"


def test_backend_is_not_part_of_an_indexs_identity():
    auto = IndexConfig().model_dump()
    torch_backend = IndexConfig(build={"embedder": {"backend": "torch"}}).model_dump()
    assert auto["build"]["embedder"]["backend"] == "auto" and torch_backend["build"]["embedder"]["backend"] == "torch"
    assert index_identity(auto) == index_identity(torch_backend)
    assert "build" not in index_identity(auto)
    with pytest.raises(ValueError):
        IndexConfig(build={"embedder": {"backend": "tensorrt"}})
