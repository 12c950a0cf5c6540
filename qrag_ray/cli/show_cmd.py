"""`qrag show`: a chunk or a whole document of a local index by id, as GET /v1/chunks/{id} and
GET /v1/documents/{id} return them (the same records: Shard.fetch_records in qrag_ray.search.shard)."""

from __future__ import annotations

import json

import typer

from qrag_ray.errors import QragError


def register(app: typer.Typer) -> None:
    @app.command()
    def show(
        chunk_id: str | None = typer.Argument(None, help="the chunk id (doc_id#n)"),
        index: str = typer.Option(..., "--index", help="index directory"),
        doc: str | None = typer.Option(None, "--doc", help="show this document's chunks instead"),
        json_out: bool = typer.Option(False, "--json", help="print the API's JSON body"),
    ):
        """Show a chunk (text, document, url, metadata, generated questions) or a document's chunks."""
        from qrag_ray.index.format import load_manifest
        from qrag_ray.search.page import document_body
        from qrag_ray.search.shard import Shard, shard_of_chunk

        if (chunk_id is None) == (doc is None):
            raise QragError("give a chunk id or --doc DOC_ID (one of them)")
        manifest = load_manifest(index)
        where = {"index": str(manifest.path), "index_version": manifest.index_version}
        if doc is None:
            chunk_idx, number = shard_of_chunk(chunk_id, manifest.num_shards)
            found = [record for record in Shard.open(manifest, number).fetch_records([chunk_idx])
                     if record["chunk_id"] == chunk_id]
            if not found:
                raise QragError(f"no chunk {chunk_id!r} in {manifest.path}")
            body = {**found[0], **where}
        else:
            records = [record for number in range(manifest.num_shards)
                       for record in Shard.open(manifest, number).fetch_records(doc_id=doc)]
            if not records:
                raise QragError(f"no document {doc!r} in {manifest.path}")
            body = {**document_body(doc, records), **where}
        if json_out:
            print(json.dumps(body, indent=2, ensure_ascii=False))
            return
        link = f" <{body['url']}>" if body["url"] else ""
        print(f"{body.get('chunk_id') or body['doc_id']}: {body['title']}{link}")
        for name, value in body["metadata"].items():
            print(f"  {name}: {value}")
        for chunk in body.get("chunks") or [body]:
            print(f"\n[{chunk['chunk_id']}]\n{chunk['text']}")
            for question in chunk["questions"]:
                print(f"  ? {question}")
