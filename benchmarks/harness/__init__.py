"""What the benchmark scripts share: the command line (options), percentiles, tables and JSON (report),
baseline trees side by side (trees), index builds and queries (indexes), served apps on a local Ray
(served), closed-loop load and the same-ranking check (load), CPU and memory by process (processes),
a synthetic big tenant (synthetic), the many-tenant mix (tenant_mix), embedders (models) and the
embedding stage's timing (embed_stage). Nothing is imported here: a script loads only what it uses (the
GPU machine has no Ray Serve, FastAPI or httpx)."""
