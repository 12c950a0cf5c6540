"""`qrag mcp`: an MCP server (tools `search` and `fetch`) over a running qrag server, on stdio or
streamable HTTP; qrag_client.mcp_server does the work (the light client's `qrag-mcp` runs the same)."""

from __future__ import annotations

import typer

from qrag_ray.errors import QragError


def register(app: typer.Typer) -> None:
    @app.command("mcp")
    def mcp_cmd(
        url: str = typer.Option("http://127.0.0.1:8000", "--url", envvar="QRAG_URL", help="the qrag server"),
        key: str | None = typer.Option(None, "--key", envvar="QRAG_API_KEY", help="API key (or $QRAG_API_KEY)"),
        transport: str = typer.Option("stdio", "--transport", help="stdio | http (streamable HTTP at /mcp)"),
        host: str = typer.Option("127.0.0.1", "--host", help="http: the address to listen on"),
        port: int = typer.Option(8765, "--port", help="http: the port"),
        k: int = typer.Option(10, "--k", "-k", help="results per search unless the agent asks for another number "
                                                    "(1..1000)"),
        filter_json: str | None = typer.Option(
            None, "--filter", help="a metadata filter (JSON) every search gets; an agent's own filter is ANDed with "
                                   "it, so it can narrow the search, never widen it"),
        index: str | None = typer.Option(None, "--index", help="the index to search (default: the key's)"),
    ):
        """Serve the MCP tools search and fetch (the pair ChatGPT connectors require) over a qrag server."""
        if transport not in ("stdio", "http"):
            raise QragError(f"--transport must be stdio or http, not {transport!r}")
        try:
            from qrag_client.mcp_server import serve
        except ImportError as error:
            raise QragError(f"qrag mcp needs the MCP SDK ({error}): pip install 'qrag-client[mcp]'") from None
        from qrag_client import QragClientError
        from qrag_client.models import parse_filter

        try:
            serve(url, key, transport=transport, host=host, port=port, k=k, filter=parse_filter(filter_json),
                  index=index)
        except (QragClientError, ValueError) as error:
            raise QragError(str(error)) from None
