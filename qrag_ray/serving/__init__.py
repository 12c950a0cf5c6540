"""Ray Serve application for qrag indexes (docs/SERVING.md), built by `qrag_ray.serving.app:build_app`.
Pure logic imports neither Ray nor FastAPI at import time, so it is tested without a cluster."""
