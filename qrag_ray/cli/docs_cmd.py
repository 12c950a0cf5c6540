"""`qrag docs`: write to a served index with a write key, through qrag-client: `add` documents from a JSONL
file (upsert by id: POST /v1/documents), `delete` them by id or by filter (DELETE /v1/documents), and read
a write's `status` (GET /v1/writes/{id}). A write is taken once it is durable on the server; `--wait`
waits until a search sees it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from qrag_ray.errors import QragError

if TYPE_CHECKING:
    from qrag_client import QragClient, WriteReceipt, WriteStatus
    from qrag_client.models import Document

DEFAULT_URL = "http://127.0.0.1:8000"
BATCH_SIZE = 100  # documents per request: well under the server's bound on one request (413 names it)


def register(app: typer.Typer) -> None:
    docs_app = typer.Typer(help="Add, replace and delete the documents of a served index (a write key).",
                           no_args_is_help=True)
    app.add_typer(docs_app, name="docs")

    @docs_app.command("add")
    def docs_add(
        file: Path = typer.Argument(..., help="JSONL, a document a line, as `qrag index --format jsonl` reads it: "
                                              "id, text, title, url, metadata"),
        url: str = typer.Option(DEFAULT_URL, "--url", envvar="QRAG_URL", help="the qrag server (or $QRAG_URL)"),
        key: str | None = typer.Option(None, "--key", envvar="QRAG_API_KEY", help="a write key (or $QRAG_API_KEY)"),
        index: str | None = typer.Option(None, "--index", help="the index to write (default: the key's)"),
        wait: bool = typer.Option(False, "--wait", help="return once a search sees the documents"),
        timeout: float = typer.Option(300.0, "--timeout", help="--wait: give up after this many seconds"),
        batch_size: int = typer.Option(BATCH_SIZE, "--batch-size", min=1, help="documents per request"),
    ):
        """Add documents, or replace those whose id the index holds; prints each write's id and status."""
        documents = read_documents(file)
        batches = [documents[start:start + batch_size] for start in range(0, len(documents), batch_size)]
        with _client(url, key) as client:
            receipts = [_call(client.upsert, batch, index=index) for batch in batches]
            for receipt in receipts:
                print(_receipt_line(receipt))
            if wait:
                for receipt in receipts:
                    print(_status_line(_call(client.wait_until_searchable, receipt, timeout=timeout)))

    @docs_app.command("delete")
    def docs_delete(
        doc_id: list[str] = typer.Option([], "--id", help="a document id to delete (repeatable)"),
        filter_json: str | None = typer.Option(
            None, "--filter", help='delete every document this metadata filter passes (JSON, e.g. \'{"type": "eq", '
                                   '"key": "source", "value": "old"}\'; docs/SERVING.md)'),
        url: str = typer.Option(DEFAULT_URL, "--url", envvar="QRAG_URL", help="the qrag server (or $QRAG_URL)"),
        key: str | None = typer.Option(None, "--key", envvar="QRAG_API_KEY", help="a write key (or $QRAG_API_KEY)"),
        index: str | None = typer.Option(None, "--index", help="the index to write (default: the key's)"),
        wait: bool = typer.Option(False, "--wait", help="return once searches no longer see them"),
        timeout: float = typer.Option(300.0, "--timeout", help="--wait: give up after this many seconds"),
    ):
        """Delete documents by id (ids the index does not hold are no error) or by filter: one of the two."""
        from qrag_client.models import parse_filter

        if bool(doc_id) == (filter_json is not None):
            raise QragError("give --id ID (repeatable) or --filter JSON: one of the two")
        try:
            selector: dict[str, Any] = {"ids": doc_id} if doc_id else {"filter": parse_filter(filter_json)}
        except ValueError as error:
            raise QragError(str(error)) from None
        with _client(url, key) as client:
            receipt = _call(client.delete, index=index, **selector)
            print(_receipt_line(receipt))
            if wait:
                print(_status_line(_call(client.wait_until_searchable, receipt, timeout=timeout)))

    @docs_app.command("status")
    def docs_status(
        write_id: str = typer.Argument(..., help="a write's id, as add or delete printed it"),
        url: str = typer.Option(DEFAULT_URL, "--url", envvar="QRAG_URL", help="the qrag server (or $QRAG_URL)"),
        key: str | None = typer.Option(None, "--key", envvar="QRAG_API_KEY", help="API key (or $QRAG_API_KEY)"),
        json_out: bool = typer.Option(False, "--json", help="print the raw JSON body"),
    ):
        """Where a write stands: queued, indexing (chunks embedded so far), searchable, or failed (why)."""
        with _client(url, key) as client:
            status = _call(client.write_status, write_id)
        if json_out:
            print(json.dumps(status.model_dump(mode="json"), indent=2, ensure_ascii=False))
            return
        print(_status_line(status))


def read_documents(path: Path) -> list[Document]:
    """The documents of a JSONL file, read as `qrag index --format jsonl` reads a record (the same fields
    and checks: an id, a string text, metadata values of the supported types); QragError names the line."""
    from qrag_client.models import Document
    from qrag_ray.io.readers import parse_jsonl_line

    if not path.is_file():
        raise QragError(f"{path}: no such file")
    documents = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            record = parse_jsonl_line(line, f"{path}:{number}", None)
            if record is None:
                continue
            if not record["text"].strip():
                raise QragError(f"{path}:{number}: record {record['doc_id']!r} has an empty 'text'")
            documents.append(Document(id=record["doc_id"], text=record["text"], title=record["title"],
                                      url=record["url"] or None,
                                      metadata=json.loads(record["metadata"]) if record["metadata"] else {}))
    if not documents:
        raise QragError(f"{path}: no documents (a JSON object a line)")
    return documents


def _client(url: str, key: str | None) -> QragClient:
    from qrag_client import QragClient

    return QragClient(url, api_key=key, timeout=120)


def _call(method: Any, *args: Any, **kwargs: Any) -> Any:
    """A client call, its failure as one CLI line: the API's error (status, kind, message), the transport's,
    a write that failed or did not become searchable in time."""
    from pydantic import ValidationError

    from qrag_client import QragClientError

    try:
        return method(*args, **kwargs)
    except ValidationError as error:
        first = error.errors()[0]
        raise QragError(f"invalid request: {first['msg']} ({'.'.join(map(str, first['loc']))})") from None
    except QragClientError as error:
        raise QragError(str(error)) from None


def _receipt_line(receipt: WriteReceipt) -> str:
    count = "documents by filter" if receipt.documents is None else f"{receipt.documents} documents"
    return f"{receipt.write_id}\t{receipt.status}\t{receipt.operation} of {count} in '{receipt.index}'"


def _status_line(status: WriteStatus) -> str:
    parts = [status.write_id, status.status, f"{status.operation} in '{status.index}'"]
    if status.chunks is not None:
        parts.append(f"{status.indexed} of {status.chunks} chunks indexed")
    if status.searchable_at is not None:
        parts.append(f"searchable {status.searchable_at - status.submitted_at:.2f} s after it was taken")
    if status.error is not None:
        where = "" if status.error.record is None else f"record {status.error.record}: "
        parts.append(f"error: {where}{status.error.message}")
    return "\t".join(parts)
