"""The client's models (clients/python/qrag_client/models.py) against the server's OpenAPI document, built
in process from the Router's FastAPI app (the one the served-schema test holds equal to the live server's):
every request field the server takes is a parameter of the client and no other; every response field the
server sends is a field of the client's model, the client expects no field the server does not send, and
requires none the server may leave out. Nested records are followed, the search filter's models
included. So the two cannot drift apart unnoticed. Every route the client calls must be the server's: the
fetch routes, the search filter and the write routes ship in the same release as the client, so a server
without one fails here. And qrag-ray pins the client version it ships with. Imports only; no Ray."""

from __future__ import annotations

import tomllib
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from qrag_client import models

ROOT = Path(__file__).resolve().parents[2]


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
    operation = spec["paths"][path][method]
    node = operation["requestBody"] if status is None else operation["responses"][status]
    return _schema(spec, node["content"]["application/json"]["schema"])


def _route_exists(spec: dict, path: str, method: str) -> None:
    assert method in spec["paths"].get(path, {}), f"the server has no {method.upper()} {path}"


def _compare(spec: dict, model: type[BaseModel], server: dict, where: str) -> list[str]:
    """Every difference between a response model and the server's schema of it, nested records included."""
    ours = model.model_fields
    theirs = server.get("properties", {})
    problems = [f"{where}: the server sends {f!r}, the client has no field for it" for f in theirs if f not in ours]
    problems += [f"{where}: the client expects {f!r}, the server has no such field" for f in ours
                 if f not in theirs]
    required = set(server.get("required", []))
    problems += [f"{where}: the client requires {f!r}, the server may leave it out" for f, info in ours.items()
                 if info.is_required() and f in theirs and f not in required]
    for field, info in ours.items():
        sub = _record(info.annotation)
        if sub is not None and field in theirs:
            problems += _compare(spec, sub, _schema(spec, theirs[field]), f"{where}.{field}")
    return problems


RESPONSES = [(models.SearchResponse, "/v1/search", "post", "200"),
             (models.AnswerResponse, "/v1/answer", "post", "200"),
             (models.IndexesResponse, "/v1/indexes", "get", "200"),
             (models.ErrorResponse, "/v1/search", "post", "422"),
             (models.ChunkResponse, "/v1/chunks/{chunk_id}", "get", "200"),
             (models.DocumentResponse, "/v1/documents/{doc_id}", "get", "200"),
             (models.WriteReceipt, "/v1/documents", "post", "202"),
             (models.WriteReceipt, "/v1/documents", "delete", "202"),
             (models.WriteStatus, "/v1/writes/{write_id}", "get", "200")]


@pytest.mark.parametrize("model,path,method,status", RESPONSES,
                         ids=[f"{r[0].__name__}-{r[2]}" for r in RESPONSES])
def test_response_models_match_the_servers(spec, model, path, method, status):
    _route_exists(spec, path, method)
    problems = _compare(spec, model, _route_schema(spec, path, method, status), model.__name__)
    assert problems == []


REQUESTS = [(models.SearchRequest, "/v1/search", "post"), (models.AnswerRequest, "/v1/answer", "post"),
            (models.UpsertRequest, "/v1/documents", "post"), (models.DeleteRequest, "/v1/documents", "delete")]


@pytest.mark.parametrize("model,path,method", REQUESTS, ids=[r[0].__name__ for r in REQUESTS])
def test_request_fields_are_the_servers(spec, model, path, method):
    _route_exists(spec, path, method)
    theirs = set(_route_schema(spec, path, method, None)["properties"])
    ours = set(model.model_fields)
    assert theirs - ours == set(), "the server takes fields the client cannot send"
    assert ours - theirs == set(), "the client sends fields the server does not take"


def test_a_documents_fields_are_the_servers(spec):
    """A record of POST /v1/documents: the index's input schema, the same on both sides."""
    _route_exists(spec, "/v1/documents", "post")
    upsert = _route_schema(spec, "/v1/documents", "post", None)
    record = _schema(spec, upsert["properties"]["documents"])
    assert set(record["properties"]) == set(models.Document.model_fields)
    required = {name for name, info in models.Document.model_fields.items() if info.is_required()}
    assert set(record.get("required", [])) == required


@pytest.mark.parametrize("model", [models.ComparisonFilter, models.InFilter, models.CompoundFilter])
def test_the_filter_models_are_the_servers(spec, model):
    """The typed search filter (what the MCP tool `search` shows an agent) is the server's grammar: the same
    records, fields and operators."""
    theirs = spec["components"]["schemas"][model.__name__]
    assert set(theirs["properties"]) == set(model.model_fields)
    assert set(theirs["properties"]["type"]["enum"]) == set(typing.get_args(model.model_fields["type"].annotation))


def test_the_check_sees_a_drift(spec):
    """The comparison is not vacuous: a server field the client lacks, and a client field the server
    lacks, both show."""
    server = _route_schema(spec, "/v1/search", "post", "200")

    class Shrunk(BaseModel):  # SearchResponse without `took_ms`, with a field of its own
        results: list[models.SearchResult]
        index: str
        index_version: str
        mode: str
        hypothetical: str | None = None
        timings: dict = {}
        extra_field: int

    problems = _compare(spec, Shrunk, server, where="Shrunk")
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
