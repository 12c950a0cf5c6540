"""Ray Serve application for qrag indexes (docs/SERVING.md).

Pure logic (request models, tenants, app args, version swaps, answer parsing) lives in modules that
import neither Ray nor FastAPI at import time, so it is tested without a cluster; `http`, `router`,
`retrieval`, `shard_deployment` and `app` wire it into Serve. The Serve application builder is
`qrag_ray.serving.app:build_app`.
"""
