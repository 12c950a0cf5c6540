"""Ray Serve application for qrag indexes (docs/SERVING.md), built by `qrag_ray.serving.application:build_app`.
Pure logic imports neither Ray nor FastAPI at import time, so it is tested without a cluster."""
