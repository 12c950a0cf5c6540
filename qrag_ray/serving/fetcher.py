"""GET /v1/chunks/{chunk_id} and GET /v1/documents/{doc_id} behind the Router's routes: the tenant's version,
then its shard backend (the Router's own store for a small tenant, the ShardSearcher replicas for a big
one): a chunk from the one shard the placement rule names, a document from every shard at once."""

from __future__ import annotations

import asyncio

from qrag_ray.errors import QragError
from qrag_ray.search.fetch import chunk_shard, document_body
from qrag_ray.serving import api_models as m
from qrag_ray.serving.api_errors import ApiError, index_unavailable
from qrag_ray.serving.tenants import Tenant
from qrag_ray.serving.tenant_versions import TenantVersions


class Fetcher:
    """`backend(ti)`: the tenant version's shard backend (QueryBatcher.shards), whose `call(shard, "fetch",
    key, ...)` reaches the store holding the shard."""

    def __init__(self, versions: TenantVersions, backend):
        self.versions, self.backend = versions, backend

    async def chunk(self, tenant: Tenant, chunk_id: str, stage: dict) -> m.ChunkResponse:
        ti = await self.versions.current(tenant)
        ci, shard = chunk_shard(chunk_id, ti.num_shards)
        stage["stage"] = "reading the chunk"
        try:
            found = await self.backend(ti).call(shard, "fetch", ti.key(tenant.name), [ci], None)
        except QragError as e:
            raise index_unavailable(tenant.name, str(e)) from None
        found = [r for r in found if r["chunk_id"] == chunk_id]
        if not found:
            raise ApiError(404, "not_found", f"index '{tenant.name}' has no chunk {chunk_id!r}")
        return m.ChunkResponse(**found[0], index=tenant.name, index_version=ti.version)

    async def document(self, tenant: Tenant, doc_id: str, stage: dict) -> m.DocumentResponse:
        ti = await self.versions.current(tenant)
        backend, key = self.backend(ti), ti.key(tenant.name)
        stage["stage"] = "reading the document's chunks"
        try:
            parts = await asyncio.gather(*[backend.call(s, "fetch", key, None, doc_id) for s in range(ti.num_shards)])
        except QragError as e:
            raise index_unavailable(tenant.name, str(e)) from None
        records = [r for part in parts for r in part]
        if not records:
            raise ApiError(404, "not_found", f"index '{tenant.name}' has no document {doc_id!r}")
        return m.DocumentResponse(**document_body(doc_id, records), index=tenant.name, index_version=ti.version)
