"""Ray Serve application for qrag indexes (DESIGN §5, docs/SERVING.md).

Pure logic (request models, tenants, merging, app args) lives in modules that import neither Ray nor
FastAPI at import time, so it can be tested without a cluster; `deployments`, `router` and `app` wire
it into Serve. The Serve application builder is `qrag_ray.serving.app:build_app`.
"""
