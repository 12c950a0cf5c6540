"""GET /v1/chunks/{chunk_id} and GET /v1/documents/{doc_id} behind the Router's routes: the tenant's version,
then its shard backend (the Router's own cache for a small tenant, the ShardSearcher replicas for a big one): a
chunk from the one shard the placement rule names, a document from every shard at once."""

from __future__ import annotations

import asyncio

from qrag_ray.errors import QragError
from qrag_ray.search.page import document_body
from qrag_ray.search.shard import shard_of_chunk
from qrag_ray.serving import api_models as m
from qrag_ray.serving.api_errors import ApiError, index_unavailable
from qrag_ray.serving.tenant_versions import TenantVersions
from qrag_ray.serving.tenants import Tenant


class Fetcher:
    """Chunks and documents by id, from the tenant's version in force."""

    def __init__(self, versions: TenantVersions):
        self.versions = versions

    async def chunk(self, tenant: Tenant, chunk_id: str, stage: dict) -> m.ChunkResponse:
        """One chunk's record (404 when the index has none with this id)."""
        version = await self.versions.current(tenant)
        chunk_idx, number = shard_of_chunk(chunk_id, version.num_shards)
        stage["stage"] = "reading the chunk"
        try:
            found = await version.backend.fetch(version.key(tenant.name), number, [chunk_idx], None)
        except QragError as error:
            raise index_unavailable(tenant.name, str(error)) from None
        found = [record for record in found if record["chunk_id"] == chunk_id]
        if not found:
            raise ApiError(404, "not_found", f"index '{tenant.name}' has no chunk {chunk_id!r}")
        return m.ChunkResponse(**found[0], index=tenant.name, index_version=version.index_version)

    async def document(self, tenant: Tenant, doc_id: str, stage: dict) -> m.DocumentResponse:
        """One document with its chunks in document order (404 when the index has none with this id)."""
        version = await self.versions.current(tenant)
        key = version.key(tenant.name)
        stage["stage"] = "reading the document's chunks"
        try:
            parts = await asyncio.gather(*[version.backend.fetch(key, number, None, doc_id)
                                           for number in range(version.num_shards)])
        except QragError as error:
            raise index_unavailable(tenant.name, str(error)) from None
        records = [record for part in parts for record in part]
        if not records:
            raise ApiError(404, "not_found", f"index '{tenant.name}' has no document {doc_id!r}")
        return m.DocumentResponse(**document_body(doc_id, records), index=tenant.name,
                                  index_version=version.index_version)
