"""The benchmarks: one script per question (benchmarks/README.md), each run from the repository root as
`python -m benchmarks.<script>`, sharing the harness in benchmarks/harness/."""
