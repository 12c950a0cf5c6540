"""An MCP server over a running qrag server (`qrag-client[mcp]`): the two read-only tools ChatGPT
connectors and deep research require, shaped as they specify, over stdio or streamable HTTP.

- `search(query, k?, filter?)` -> `{"results": [{"id", "title", "url", "text"}]}`: the chunks /v1/search
  returns, in its order (`id` a chunk id, `text` a snippet of the chunk); `k` 1..1000 (default the
  server's --k), `filter` the search filter's grammar, typed in the tool's input schema;
- `fetch(id)` -> `{"id", "title", "text", "url", "metadata"}`: the full document of a chunk id (or of a
  document id), its chunks in order; `metadata` has the document's fields, the chunk's generated
  questions and the index version.

Each result comes back as structured content and as the same JSON in one text item. An argument a tool
does not declare is an error, and its input schema says so (`additionalProperties: false`). A server-wide
filter and index scope every search (`--filter`, `--index`): an agent's own filter is ANDed with the
server's, so it narrows what the agent sees and never widens it.

    qrag-mcp --url http://127.0.0.1:8000 --key KEY                       # stdio (a desktop client spawns it)
    qrag-mcp --url http://127.0.0.1:8000 --transport http --port 8765    # http://127.0.0.1:8765/mcp
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
from collections.abc import Callable
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp_types import ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field

from qrag_client import __version__
from qrag_client.client import DEFAULT_URL, AsyncQragClient, QragClient, quote_id
from qrag_client.errors import NotFoundError, QragClientError
from qrag_client.models import MAX_K, Filter, SearchFilter, SearchResult, parse_filter

SNIPPET_CHARS = 400
MAX_QUERY_CHARS = 2000  # the server's bound on a query
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


def both(bound: Filter | None, asked: Filter | None) -> Filter | None:
    """The filter a search runs with: the server's bound AND the agent's own (either may be absent)."""
    if bound is None or asked is None:
        return asked if bound is None else bound
    return {"type": "and", "filters": [bound, asked]}


def _tool(function: Callable[..., Any]) -> Tool:
    """A read-only tool from `function`, described by its docstring without the source's indentation, whose
    arguments are closed: one it does not declare is an error (the SDK would drop it unseen), and its input
    schema says so (`additionalProperties: false`), so an agent's misspelt argument fails instead of being
    ignored."""
    description = inspect.cleandoc(function.__doc__ or "")
    tool = Tool.from_function(function, description=description, annotations=_READ_ONLY)
    declared = tool.fn_metadata.arg_model

    class ClosedArguments(declared):
        model_config = ConfigDict(extra="forbid", title=declared.__name__)

    tool.fn_metadata.arg_model = ClosedArguments
    tool.parameters = ClosedArguments.model_json_schema(by_alias=True)
    return tool


def build_server(url: str = DEFAULT_URL, api_key: str | None = None, *, k: int = 10, filter: Filter | None = None,
                 index: str | None = None, timeout: float = 60.0, **client_options: Any) -> MCPServer:
    """The MCP server; every tool call is a request to the qrag server at `url` (`client_options` go to
    AsyncQragClient: retry, headers, transport). `k`: results per search unless the agent asks for
    another number; `filter`: a bound on every search (ANDed with the agent's)."""
    if not 1 <= k <= MAX_K:
        raise ValueError(f"--k must be 1..{MAX_K}, not {k}")
    base = url.rstrip("/")
    default_k = k
    bound = filter

    def open_client() -> AsyncQragClient:
        return AsyncQragClient(base, api_key, timeout=timeout, **client_options)

    def hit(result: SearchResult) -> SearchHit:
        return SearchHit(id=result.chunk_id, title=result.title or result.doc_id, text=_snippet(result.text),
                         url=result.url or f"{base}/v1/chunks/{quote_id(result.chunk_id)}")

    async def search(
        query: Annotated[str, Field(min_length=1, max_length=MAX_QUERY_CHARS,
                                    description="what to look for; a natural-language question works best")],
        k: Annotated[int, Field(ge=1, le=MAX_K, description=f"how many passages, 1..{MAX_K}")] = default_k,
        filter: Annotated[SearchFilter | None, Field(
            description="only passages whose document's metadata passes this: a comparison {type: eq|ne|gt|gte|"
                        "lt|lte, key, value}, a set {type: in|nin, key, value: [...]}, or {type: and|or, filters: "
                        "[...]}; dates as ISO-8601 strings")] = None,
    ) -> SearchResults:
        """Search the documents for passages that answer a question. Returns the best passages, best
        first, each with an id for `fetch`, a title, a URL to cite and the beginning of its text."""
        asked = filter.model_dump(mode="json") if filter is not None else None
        try:
            async with open_client() as client:
                page = await client.search(query, k, filter=both(bound, asked), index=index)
        except QragClientError as error:
            raise ToolError(str(error)) from None
        return SearchResults(results=[hit(r) for r in page.results])

    async def fetch(id: str) -> FetchedDocument:
        """Fetch the whole document a search result (an id from `search`) belongs to: its title, full text,
        URL and metadata (the document's fields, the passage's generated questions)."""
        try:
            async with open_client() as client:
                try:
                    chunk = await client.chunk(id, index=index)
                except NotFoundError:
                    chunk = None  # not a chunk id: a document id, then
                doc = await client.document(chunk.doc_id if chunk else id, index=index)
        except NotFoundError:
            raise ToolError(f"unknown id {id!r}: give an id that search returned") from None
        except QragClientError as error:
            raise ToolError(str(error)) from None
        meta = {**doc.metadata, "doc_id": doc.doc_id, "index": doc.index, "index_version": doc.index_version}
        if chunk is not None:
            meta |= {"chunk_id": chunk.chunk_id, "questions": chunk.questions}
        return FetchedDocument(id=id, title=doc.title or doc.doc_id, text=doc.text, metadata=meta,
                               url=doc.url or f"{base}/v1/documents/{quote_id(doc.doc_id)}")

    return MCPServer("qrag", version=__version__, log_level="WARNING", tools=[_tool(search), _tool(fetch)],
                     instructions="Search a qrag index with `search` (natural-language questions work best), "
                                  "then read a whole document with `fetch` and one of the ids it returned.")


def check_reachable(url: str, api_key: str | None) -> None:
    """Fail at start, in one line, on a server that cannot be reached or a key it refuses."""
    with QragClient(url, api_key, timeout=30) as client:
        client.indexes()


def serve(url: str = DEFAULT_URL, api_key: str | None = None, *, transport: str = "stdio", host: str = "127.0.0.1",
          port: int = 8765, path: str = "/mcp", k: int = 10, filter: Filter | None = None,
          index: str | None = None) -> None:
    """Run the server until stopped: over stdio, or streamable HTTP at http://host:port/path."""
    server = build_server(url, api_key, k=k, filter=filter, index=index)
    check_reachable(url, api_key)
    if transport == "stdio":
        server.run("stdio")
    elif transport == "http":
        server.run("streamable-http", host=host, port=port, streamable_http_path=path)
    else:
        raise ValueError(f"unknown transport {transport!r} (stdio or http)")


def main(argv: list[str] | None = None) -> int:
    """`qrag-mcp`: the MCP server from the command line (`qrag mcp` in qrag-ray runs the same)."""
    parser = argparse.ArgumentParser(prog="qrag-mcp", description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=os.environ.get("QRAG_URL", DEFAULT_URL),
                        help="the qrag server (or $QRAG_URL)")
    parser.add_argument("--key", default=os.environ.get("QRAG_API_KEY"), help="its API key (or $QRAG_API_KEY)")
    parser.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    parser.add_argument("--host", default="127.0.0.1", help="http: the address to listen on")
    parser.add_argument("--port", type=int, default=8765, help="http: the port")
    parser.add_argument("--k", type=int, default=10, help=f"results per search unless the agent asks (1..{MAX_K})")
    parser.add_argument("--filter",
                        help="a metadata filter (JSON) every search gets; an agent's own is ANDed with it")
    parser.add_argument("--index", help="the index to search (default: the key's)")
    args = parser.parse_args(argv)
    try:
        serve(args.url, args.key, transport=args.transport, host=args.host, port=args.port, k=args.k,
              filter=parse_filter(args.filter), index=args.index)
    except (QragClientError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
