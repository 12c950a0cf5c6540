"""What serving_writes.py sends and reads: the corpora (SQuAD's dev contexts or the language reference's
paragraphs, their upserts and edits, synthetic documents), the HTTP calls of the write routes (an upsert timed
until searchable, a search page), the open-loop writes beside closed-loop searches and their summaries, and a
deletion timed until search stops returning it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from benchmarks.harness.report import pct

K = 10  # results per search page

# ---- the corpora ---------------------------------------------------------------------------------------------
def squad_or_reference(squad: str, count: int) -> tuple[list[dict], list[str], str]:
    """(documents {doc_id, title, text} in file order, questions, what they are): SQuAD's dev contexts and
    their questions, or where `squad` is missing the language reference's paragraphs (over 200 characters)
    and a question per help topic."""
    path = Path(squad)
    if path.is_file():
        from qrag_ray.evaluation.loaders import load_squad

        squad_set = load_squad(path)
        return squad_set.corpus, [q["text"] for q in squad_set.queries], f"SQuAD v1.1 dev contexts ({path.name})"
    from pydoc_data.topics import topics

    from benchmarks.harness.indexes import make_queries

    paragraphs = [(name, text.strip()) for name, body in sorted(topics.items()) for text in body.split("\n\n")
                  if len(text.strip()) > 200]
    documents = [{"doc_id": f"{name}-{n}", "title": name, "text": text} for n, (name, text) in enumerate(paragraphs)]
    return documents, make_queries(count), "Python language reference paragraphs (no SQuAD file)"


def first_sentence(text: str) -> str:
    """A document's first sentence (at most 300 characters): the query that finds it."""
    from qrag_ray.text.sentences import split_sentences

    return (split_sentences(text) or [text])[0][:300]


def edited(document: dict) -> dict:
    """An edit of a document: its sentences rotated by one (the same words, a new text to embed)."""
    from qrag_ray.text.sentences import split_sentences

    sentences = split_sentences(document["text"]) or [document["text"]]
    return {**document, "text": " ".join(sentences[1:] + sentences[:1]) + " (edited)"}


def upserts_of(corpus: list[dict], base_count: int, writes: int) -> list[dict]:
    """The freshness writes: the documents after the base as new ones, then edits of the base's documents
    at even positions (the odd ones stay as built: the deletion's candidates)."""
    new = corpus[base_count:base_count + writes]
    even = corpus[:base_count:2]
    return new + [edited(even[n % len(even)]) for n in range(writes - len(new))]


def api_document(record: dict) -> dict:
    """A corpus record as POST /v1/documents takes it."""
    return {"id": record["doc_id"], "title": record.get("title") or "", "text": record["text"]}


def write_corpus(path: Path, records: list[dict]) -> Path:
    """Records as `qrag index --format jsonl` reads them (doc_id, title, text)."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as stream:
        for record in records:
            stream.write(json.dumps({"doc_id": record["doc_id"], "title": record.get("title") or "",
                                     "text": record["text"]}, ensure_ascii=False) + "\n")
    return path


def synthetic_documents(prefix: str, count: int, seed: int) -> list[dict]:
    """`count` documents of four eight-word sentences of the synthetic index's words (~250 characters: one
    chunk and four sentence rows in its representation)."""
    import numpy as np

    from benchmarks.harness.synthetic import WORDS

    rng = np.random.default_rng(seed)
    words = np.asarray(WORDS)[rng.integers(0, len(WORDS), size=(count, 4, 8))]
    return [{"id": f"{prefix}-{n}", "text": " ".join(" ".join(s).capitalize() + "." for s in doc)}
            for n, doc in enumerate(words)]


# ---- HTTP ----------------------------------------------------------------------------------------------------
def bearer(key: str) -> dict:
    """The Authorization header of a tenant key."""
    return {"Authorization": f"Bearer {key}"}


def wait_searchable(client, write_id: str, headers: dict, poll_s: float, timeout: float = 600) -> dict:
    """Poll GET /v1/writes/{id} until the write is searchable (its status); a failed or late write raises."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        response = client.get(f"/v1/writes/{write_id}", headers=headers)
        response.raise_for_status()
        status = response.json()
        if status["status"] == "searchable":
            return status
        if status["status"] == "failed":
            raise RuntimeError(f"write {write_id} failed: {status['error']}")
        time.sleep(poll_s)
    raise RuntimeError(f"write {write_id} not searchable after {timeout:.0f} s")


def search_page(client, headers: dict, query: str, k: int = K) -> dict:
    """One search's answer (raises on a non-200)."""
    response = client.post("/v1/search", json={"query": query, "k": k}, headers=headers)
    response.raise_for_status()
    return response.json()


# ---- part freshness ------------------------------------------------------------------------------------------
async def writes_beside_searches(url: str, headers: dict, documents: list[dict], queries: list[str], args) -> dict:
    import httpx

    searches: list[dict] = []
    writes: list[dict] = []
    phase = {"name": "before"}
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=args.clients + 64)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120, limits=limits) as client:
        async def searcher(first: int) -> None:
            """A closed-loop client: its next search as soon as the last one answered, until stopped."""
            n = first
            while not stop.is_set():
                name = phase["name"]
                start = time.perf_counter()
                try:
                    status = (await client.post("/v1/search", json={"query": queries[n % len(queries)], "k": K}))\
                        .status_code
                except httpx.HTTPError:
                    status = 0
                searches.append({"phase": name, "status": status, "ms": (time.perf_counter() - start) * 1000})
                n += args.clients

        async def one_write(document: dict) -> None:
            """POST the document, then poll its status until searchable."""
            record = {"id": document["id"], "polls": 0}
            try:
                response = await client.post("/v1/documents", json={"documents": [document]})
                record["acked_at"] = time.time()
                record["http"] = response.status_code
                if response.status_code != 202:
                    record["error"] = response.text[:300]
                    return
                write_id = response.json()["write_id"]
                while True:
                    await asyncio.sleep(args.poll_s)
                    record["polls"] += 1
                    status = (await client.get(f"/v1/writes/{write_id}")).json()
                    if status["status"] in ("searchable", "failed"):
                        record.update(seen_at=time.time(), status=status["status"], submitted_at=status["submitted_at"],
                                      searchable_at=status["searchable_at"], error=status.get("error"))
                        return
            except httpx.HTTPError as error:
                record["error"] = repr(error)
            finally:
                writes.append(record)

        clients = [asyncio.create_task(searcher(n)) for n in range(args.clients)]
        await asyncio.sleep(args.before_s)
        phase["name"] = "writes"
        started = time.perf_counter()
        pending = []
        for n, document in enumerate(documents):
            await asyncio.sleep(max(0.0, started + n / args.rate - time.perf_counter()))
            pending.append(asyncio.create_task(one_write(document)))
        sent_s = time.perf_counter() - started
        await asyncio.gather(*pending)
        writes_s = time.perf_counter() - started
        stop.set()
        await asyncio.gather(*clients)
    return {"searches": searches, "writes": writes, "sent_s": sent_s, "writes_s": writes_s}


def search_summary(records: list[dict]) -> dict:
    """Searches, failures and p50/p99 ms of the successful ones."""
    ok = [r["ms"] for r in records if r["status"] == 200]
    return {"searches": len(records), "failed": len(records) - len(ok), "p50_ms": pct(ok, 50), "p99_ms": pct(ok, 99)}


def freshness_summary(run: dict, writes_sent: int) -> dict:
    """Seconds from each write's 202 to searchable: by its status's searchable_at, and as the polls saw it."""
    done = [w for w in run["writes"] if w.get("status") == "searchable"]
    by_status = [w["searchable_at"] - w["acked_at"] for w in done]
    by_polls = [w["seen_at"] - w["acked_at"] for w in done]
    return {"writes": writes_sent, "searchable": len(done), "failed_writes": writes_sent - len(done),
            "failures": [w for w in run["writes"] if w.get("status") != "searchable"][:5],
            "p50_s": pct(by_status, 50), "p95_s": pct(by_status, 95), "max_s": max(by_status, default=float("nan")),
            "polled_p50_s": pct(by_polls, 50), "polled_p95_s": pct(by_polls, 95),
            "status_polls": sum(w["polls"] for w in run["writes"]), "sent_s": run["sent_s"],
            "writes_s": run["writes_s"],
            "rate_sent": writes_sent / run["sent_s"] if run["sent_s"] else float("nan")}


def deletion(client, headers: dict, candidates: list[dict], every_s: float = 0.05, timeout: float = 60) -> dict:
    """Delete the first candidate its own first sentence finds, then search every `every_s` until it is gone:
    the seconds from the 202 (and from the status's submitted_at to searchable_at)."""
    for candidate in candidates:
        query = first_sentence(candidate["text"])
        if any(hit["doc_id"] == candidate["doc_id"] for hit in search_page(client, headers, query)["results"]):
            break
    else:
        raise RuntimeError("no deletion candidate is found by its own first sentence")
    response = client.request("DELETE", "/v1/documents", json={"ids": [candidate["doc_id"]]}, headers=headers)
    acked = time.time()
    response.raise_for_status()
    searches = 0
    while time.time() - acked < timeout:
        searches += 1
        hits = search_page(client, headers, query)["results"]
        if not any(hit["doc_id"] == candidate["doc_id"] for hit in hits):
            gone = time.time() - acked
            break
        time.sleep(every_s)
    else:
        gone = float("nan")
    status = wait_searchable(client, response.json()["write_id"], headers, 0.1)
    return {"doc_id": candidate["doc_id"], "query": query, "gone_s": gone, "searches": searches,
            "status_s": status["searchable_at"] - status["submitted_at"]}

# ---- part big ------------------------------------------------------------------------------------------------
def timed_upsert(client, headers: dict, documents: list[dict]) -> dict:
    """One upsert until searchable: the Writer's seconds (submitted_at to searchable_at) and the client's
    (the POST to seeing it searchable, polled every 0.1 s)."""
    start = time.time()
    response = client.post("/v1/documents", json={"documents": documents}, headers=headers)
    response.raise_for_status()
    status = wait_searchable(client, response.json()["write_id"], headers, 0.1)
    return {"documents": len(documents), "chunks": status["chunks"],
            "writer_s": status["searchable_at"] - status["submitted_at"], "client_s": time.time() - start}


def delta_vectors(root: Path) -> int:
    """Vector rows in the root's deltas (its published write state)."""
    from qrag_ray.index.write_state import load_write_state

    state = load_write_state(root)
    return sum(delta.vectors for delta in state.deltas) if state else 0
