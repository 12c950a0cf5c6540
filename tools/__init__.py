"""Repository tools (run from the repo root, not installed with qrag_ray)."""
