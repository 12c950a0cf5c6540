"""An MCP server over a running qrag server (`qrag-client[mcp]`): the two read-only tools ChatGPT
connectors and deep research require, shaped as they specify, over stdio or streamable HTTP.

- `search(query)` -> `{"results": [{"id", "title", "url", "text"}]}`: the chunks /v1/search returns, in
  its order (`id` a chunk id, `text` a snippet of the chunk);
- `fetch(id)` -> `{"id", "title", "text", "url", "metadata"}`: the full document of a chunk id (or of a
  document id), its chunks in order; `metadata` has the document's fields, the chunk's generated
  questions and the index version.

Each result comes back as structured content and as the same JSON in one text item. A server-wide k,
filter and index scope every search (`--k`, `--filter`, `--index`): a connector sees only what it may.

    qrag-mcp --url http://127.0.0.1:8000 --key KEY                       # stdio (a desktop client spawns it)
    qrag-mcp --url http://127.0.0.1:8000 --transport http --port 8765    # http://127.0.0.1:8765/mcp
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field

from qrag_client.client import DEFAULT_URL, AsyncQragClient, QragClient, quote_id
from qrag_client.errors import NotFoundError, QragClientError
from qrag_client.models import Filter, SearchResult, parse_filter

SNIPPET_CHARS = 400
_READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)


class SearchHit(BaseModel):
    id: str = Field(..., description="a chunk id: pass it to fetch")
    title: str
    url: str = Field(..., description="the source's URL, else the chunk's URL on the qrag API")
    text: str = Field(..., description="the beginning of the chunk")


class SearchResults(BaseModel):
    results: list[SearchHit]


class FetchedDocument(BaseModel):
    id: str = Field(..., description="the id asked for")
    title: str
    text: str = Field(..., description="the whole document, its chunks in order")
    url: str
    metadata: dict[str, Any] = Field(default_factory=dict)


def _snippet(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 1] + "…"


def build_server(url: str = DEFAULT_URL, api_key: str | None = None, *, k: int = 10, filter: Filter | None = None,
                 index: str | None = None, timeout: float = 60.0, **client_options: Any) -> MCPServer:
    """The MCP server; every tool call is a request to the qrag server at `url` (`client_options` go to
    AsyncQragClient: retry, headers, transport)."""
    base = url.rstrip("/")
    server = MCPServer("qrag", version="0.1.0", log_level="WARNING",
                       instructions="Search a qrag index with `search` (natural-language questions work best), "
                                    "then read a whole document with `fetch` and one of the ids it returned.")

    def client() -> AsyncQragClient:
        return AsyncQragClient(base, api_key, timeout=timeout, **client_options)

    def hit(r: SearchResult) -> SearchHit:
        return SearchHit(id=r.chunk_id, title=r.title or r.doc_id, text=_snippet(r.text),
                         url=r.url or f"{base}/v1/chunks/{quote_id(r.chunk_id)}")

    @server.tool(annotations=_READ_ONLY)
    async def search(query: str) -> SearchResults:
        """Search the documents for passages that answer a question. Returns the best passages, best
        first, each with an id for `fetch`, a title, a URL to cite and the beginning of its text."""
        try:
            async with client() as c:
                page = await c.search(query, k, filter=filter, index=index)
        except QragClientError as e:
            raise ToolError(str(e)) from None
        return SearchResults(results=[hit(r) for r in page.results])

    @server.tool(annotations=_READ_ONLY)
    async def fetch(id: str) -> FetchedDocument:  # noqa: A002 - the name the connector specification uses
        """Fetch the whole document a search result (an id from `search`) belongs to: its title, full text,
        URL and metadata (the document's fields, the passage's generated questions)."""
        try:
            async with client() as c:
                try:
                    chunk = await c.chunk(id, index=index)
                except NotFoundError:
                    chunk = None  # not a chunk id: a document id, then
                doc = await c.document(chunk.doc_id if chunk else id, index=index)
        except NotFoundError:
            raise ToolError(f"unknown id {id!r}: give an id that search returned") from None
        except QragClientError as e:
            raise ToolError(str(e)) from None
        meta = {**doc.metadata, "doc_id": doc.doc_id, "index": doc.index, "index_version": doc.index_version}
        if chunk is not None:
            meta |= {"chunk_id": chunk.chunk_id, "questions": chunk.questions}
        return FetchedDocument(id=id, title=doc.title or doc.doc_id, text=doc.text, metadata=meta,
                               url=doc.url or f"{base}/v1/documents/{quote_id(doc.doc_id)}")

    return server


def check_reachable(url: str, api_key: str | None) -> None:
    """Fail at start, in one line, on a server that cannot be reached or a key it refuses."""
    with QragClient(url, api_key, timeout=30) as c:
        c.indexes()


def serve(url: str = DEFAULT_URL, api_key: str | None = None, *, transport: str = "stdio", host: str = "127.0.0.1",
          port: int = 8765, path: str = "/mcp", k: int = 10, filter: Filter | None = None,
          index: str | None = None) -> None:
    """Run the server until stopped: over stdio, or streamable HTTP at http://host:port/path."""
    check_reachable(url, api_key)
    server = build_server(url, api_key, k=k, filter=filter, index=index)
    if transport == "stdio":
        server.run("stdio")
    elif transport == "http":
        server.run("streamable-http", host=host, port=port, streamable_http_path=path)
    else:
        raise ValueError(f"unknown transport {transport!r} (stdio or http)")


def main(argv: list[str] | None = None) -> int:
    """`qrag-mcp`: the MCP server from the command line (`qrag mcp` in qrag-ray runs the same)."""
    ap = argparse.ArgumentParser(prog="qrag-mcp", description=__doc__.split("\n")[0])
    ap.add_argument("--url", default=os.environ.get("QRAG_URL", DEFAULT_URL), help="the qrag server (or $QRAG_URL)")
    ap.add_argument("--key", default=os.environ.get("QRAG_API_KEY"), help="its API key (or $QRAG_API_KEY)")
    ap.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    ap.add_argument("--host", default="127.0.0.1", help="http: the address to listen on")
    ap.add_argument("--port", type=int, default=8765, help="http: the port")
    ap.add_argument("--k", type=int, default=10, help="results per search")
    ap.add_argument("--filter", help="a metadata filter (JSON) every search gets")
    ap.add_argument("--index", help="the index to search (default: the key's)")
    a = ap.parse_args(argv)
    try:
        serve(a.url, a.key, transport=a.transport, host=a.host, port=a.port, k=a.k, filter=parse_filter(a.filter),
              index=a.index)
    except (QragClientError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
