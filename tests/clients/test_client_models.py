"""The client's models (clients/python/qrag_client/models.py) against the server's OpenAPI document, built
in process from the Router's FastAPI app (the one the served-schema test holds equal to the live server's):
every request field the server takes is a parameter of the client and no other; every response field the
server sends is a field of the client's model, the client expects no field the server does not send, and
requires none the server may leave out. Nested records are followed. So the two cannot drift apart
unnoticed. And qrag-ray pins the client version it ships with. Imports only; no Ray."""

from __future__ import annotations

import tomllib
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from qrag_client import models as cm

ROOT = Path(__file__).resolve().parents[2]
FETCH_ROUTES = ("/v1/chunks/{chunk_id}", "/v1/documents/{doc_id}")
# what the filter-and-fetch contract adds; a server without the fetch routes predates it (and lacks these)
CONTRACT_ADDITIONS = {"SearchRequest": {"filter", "doc_ids"}, "AnswerRequest": {"filter", "doc_ids"},
                      "SearchResult": {"metadata", "url"}}


@pytest.fixture(scope="module")
def spec() -> dict:
    from qrag_ray.serving.router import app

    return app.openapi()


def _schema(spec: dict, node: dict) -> dict:
    """A schema with its $ref, anyOf-with-null and array items resolved to the record it holds."""
    while True:
        if "$ref" in node:
            node = spec["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
        elif "anyOf" in node:
            node = next(n for n in node["anyOf"] if n.get("type") != "null")
        elif node.get("type") == "array":
            node = node["items"]
        else:
            return node


def _record(annotation) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((r for a in typing.get_args(annotation) if (r := _record(a)) is not None), None)


def _route_schema(spec: dict, path: str, method: str, status: str | None) -> dict:
    op = spec["paths"][path][method]
    node = op["requestBody"] if status is None else op["responses"][status]
    return _schema(spec, node["content"]["application/json"]["schema"])


def _compare(spec: dict, model: type[BaseModel], server: dict, pending: bool, where: str) -> list[str]:
    """Every difference between a response model and the server's schema of it, nested records included."""
    ours, theirs = model.model_fields, server.get("properties", {})
    allowed = CONTRACT_ADDITIONS.get(model.__name__, set()) if pending else set()
    problems = [f"{where}: the server sends {f!r}, the client has no field for it" for f in theirs if f not in ours]
    problems += [f"{where}: the client expects {f!r}, the server has no such field" for f in ours
                 if f not in theirs and f not in allowed]
    required = set(server.get("required", []))
    problems += [f"{where}: the client requires {f!r}, the server may leave it out" for f, info in ours.items()
                 if info.is_required() and f in theirs and f not in required]
    for f, info in ours.items():
        sub = _record(info.annotation)
        if sub is not None and f in theirs:
            problems += _compare(spec, sub, _schema(spec, theirs[f]), pending, f"{where}.{f}")
    return problems


RESPONSES = [(cm.SearchResponse, "/v1/search", "post", "200"), (cm.AnswerResponse, "/v1/answer", "post", "200"),
             (cm.IndexesResponse, "/v1/indexes", "get", "200"), (cm.ErrorResponse, "/v1/search", "post", "422"),
             (cm.ChunkResponse, FETCH_ROUTES[0], "get", "200"), (cm.DocumentResponse, FETCH_ROUTES[1], "get", "200")]


@pytest.mark.parametrize("model,path,method,status", RESPONSES, ids=[r[0].__name__ for r in RESPONSES])
def test_response_models_match_the_servers(spec, model, path, method, status):
    pending = not all(p in spec["paths"] for p in FETCH_ROUTES)
    if path not in spec["paths"]:
        assert pending and path in FETCH_ROUTES, f"the server has no {path}"
        pytest.skip(f"this server has no {path} yet (the fetch contract): checked once it does")
    problems = _compare(spec, model, _route_schema(spec, path, method, status), pending, model.__name__)
    assert problems == []


@pytest.mark.parametrize("model,path", [(cm.SearchRequest, "/v1/search"), (cm.AnswerRequest, "/v1/answer")])
def test_request_fields_are_the_servers(spec, model, path):
    pending = not all(p in spec["paths"] for p in FETCH_ROUTES)
    theirs = set(_route_schema(spec, path, "post", None)["properties"])
    ours = set(model.model_fields)
    assert theirs - ours == set(), "the server takes fields the client cannot send"
    assert ours - theirs <= (CONTRACT_ADDITIONS[model.__name__] if pending else set()), \
        "the client sends fields the server does not take"


def test_the_check_sees_a_drift(spec):
    """The comparison is not vacuous: a server field the client lacks, and a client field the server
    lacks, both show."""
    server = _route_schema(spec, "/v1/search", "post", "200")

    class Shrunk(BaseModel):  # SearchResponse without `took_ms`, with a field of its own
        results: list[cm.SearchResult]
        index: str
        index_version: str
        mode: str
        hypothetical: str | None = None
        timings: dict = {}
        extra_field: int

    problems = _compare(spec, Shrunk, server, pending=False, where="Shrunk")
    assert any("'took_ms'" in p and "no field" in p for p in problems)
    assert any("'extra_field'" in p and "no such field" in p for p in problems)


def test_qrag_ray_pins_the_client_it_ships_with():
    import qrag_client

    main = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    client = tomllib.loads((ROOT / "clients" / "python" / "pyproject.toml").read_text())["project"]
    assert client["version"] == qrag_client.__version__
    assert f"qrag-client=={client['version']}" in main["dependencies"]
    assert any(r.startswith("qrag-client[") and r.endswith(f"=={client['version']}")
               for r in main["optional-dependencies"]["dev"])
    # the client itself stays light: httpx and pydantic, the frameworks only as its extras
    assert sorted(r.split(">")[0].split("=")[0] for r in client["dependencies"]) == ["httpx", "pydantic"]
    assert set(client["optional-dependencies"]) == {"langchain", "llamaindex", "mcp"}
