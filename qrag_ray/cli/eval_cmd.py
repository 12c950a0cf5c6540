"""`qrag eval`, `qrag matrix` and `qrag suite`: thin CLI over qrag_ray.evaluation."""

from __future__ import annotations

import json

import typer

from qrag_ray.cli.app import err
from qrag_ray.errors import QragError


def register(app: typer.Typer) -> None:
    @app.command("eval")
    def eval_cmd(
        dataset: str = typer.Option(..., "--dataset", help="squad|bipar|beir|jsonl"),
        data: str = typer.Option(..., "--data",
                                 help="SQuAD JSON file, BEIR folder, or folder with "
                                      "corpus.jsonl/queries.jsonl/qrels.tsv"),
        representations: str = typer.Option("chunk,atom-sentence", "--representations", help="comma-separated"),
        subset: int | None = typer.Option(None, "--subset", help="first N contexts/documents with their queries"),
        offset: int = typer.Option(0, "--offset",
                                   help="skip the first N contexts/documents (a held-out slice: "
                                        "--offset 300 --subset 300)"),
        k: str = typer.Option("1,2,5,10,20", "--k", help="cut-offs for recall@k / title accuracy"),
        output: str = typer.Option("runs/eval", "--output", "-o"),
        config: str | None = typer.Option(None, "--config", "-c", help="YAML index config applied to every variant"),
        generator: str | None = typer.Option(None, "--generator", help="vllm|openai|precomputed|none"),
        questions: int | None = typer.Option(None, "--questions"),
        prompt: str | None = typer.Option(None, "--prompt"),
        embedder: str | None = typer.Option(None, "--embedder"),
        shards: int | None = typer.Option(None, "--shards"),
        factory: str | None = typer.Option(None, "--factory"),
        prune_taus: str | None = typer.Option(None, "--prune-taus", help="τ sweep, e.g. 0.95,0.9,0.85"),
        questions_sweep: str | None = typer.Option(None, "--questions-sweep", help="e.g. 1,5,10,auto"),
        hyde: bool = typer.Option(False, "--hyde", help="add the HyDE query-time baseline (needs an LLM)"),
        strict: bool = typer.Option(False, "--strict", help="fail when a generated question equals a query"),
        split: str = typer.Option("test", "--split", help="BEIR qrels split"),
        variants_file: str | None = typer.Option(None, "--variants",
                                                 help="YAML list of named variants (label, representation, config "
                                                      "overrides) added after --representations"),
    ):
        """Compare representations side by side on labelled data."""
        from qrag_ray.config.index import deep_update, load_yaml, nest_dotted
        from qrag_ray.evaluation.driver import load_variants, parse_list, plan_variants, run_eval

        try:
            cutoffs = parse_list(k, int)
            taus = parse_list(prune_taus, float)
        except ValueError:
            raise QragError("--k and --prune-taus take comma-separated numbers") from None
        if subset is not None and subset < 1:
            raise QragError("--subset must be at least 1")
        if offset < 0:
            raise QragError("--offset must be 0 or more")
        base = deep_update(load_yaml(config) if config else {}, nest_dotted({
            "generator.backend": generator, "generator.questions": questions, "generator.prompt": prompt,
            "embedder.model": embedder, "shards": shards, "faiss.factory": factory}))
        variants = plan_variants(parse_list(representations), taus, parse_list(questions_sweep), hyde)
        if variants_file:
            variants += load_variants(variants_file)
        res = run_eval(dataset, data, variants, output, subset=subset, ks=cutoffs, base_overrides=base,
                       strict=strict, console=err, split=split, offset=offset)
        print(res.paths["md"].read_text())
        err.print(f"wrote {', '.join(map(str, res.paths.values()))}")
        if res.leaks:
            err.print(f"[yellow]warning:[/] generated questions equal evaluation queries: {res.leaks}")

    @app.command("matrix")
    def matrix_cmd(
        path: str = typer.Option("eval/matrix.yaml", "--matrix", help="regression matrix YAML"),
        ids: str | None = typer.Option(None, "--ids", help="comma-separated condition ids"),
        tags: str | None = typer.Option(None, "--tags", help="comma-separated tags, e.g. ci"),
        json_out: str | None = typer.Option(None, "--json", help="write measured figures here"),
    ):
        """Re-run the regression matrix; exit 1 on a regression beyond tolerance."""
        from qrag_ray.evaluation.driver import evaluate_condition, parse_list
        from qrag_ray.evaluation.matrix import run_matrix

        res = run_matrix(path, ids=parse_list(ids) or None, runner=evaluate_condition, tags=parse_list(tags) or None)
        print(res.comparison.summary())
        if json_out:
            with open(json_out, "w") as file:
                json.dump(res.measured, file, indent=2, default=str)
        if not res.passed:
            raise typer.Exit(1)

    @app.command("suite")
    def suite_cmd(
        path: str = typer.Option("eval/suite.yaml", "--suite",
                                 help="suite YAML (datasets x configurations -> figures)"),
        slice_name: str = typer.Option("full", "--slice", help="'full', or a slice the YAML names (e.g. ci)"),
        datasets: str | None = typer.Option(None, "--datasets", help="comma-separated dataset names (default: all)"),
        configs: str | None = typer.Option(None, "--configs", help="comma-separated config names (default: all)"),
        output: str = typer.Option("runs/suite", "--output", "-o"),
        record: bool = typer.Option(False, "--record", help="also print the measured table as an expected: block"),
        resume: bool = typer.Option(False, "--resume",
                                    help="keep figures an earlier run of this slice wrote to --output"),
    ):
        """Every configuration on every dataset: one table with the mean, JSON and a plot, then the matrix
        conditions the slice names; exit 1 when a figure falls below the one recorded for it."""
        from qrag_ray.evaluation.driver import parse_list
        from qrag_ray.evaluation.suite import load_suite, recorded_yaml, run_suite

        rep = run_suite(load_suite(path), output, slice_name, parse_list(datasets) or None, parse_list(configs) or None,
                        console=err, resume=resume)
        print(rep.markdown)
        if rep.matrix:
            print(f"\nregression matrix ({rep.matrix.file}, tagged {', '.join(rep.matrix.tags)}):")
            print(rep.matrix.summary)
        for label, lines in (("REGRESSION", rep.regressions), ("BETTER", rep.better)):
            for line in lines:
                print(f"{label:<12}{line}")
        if record:
            print(recorded_yaml(rep.table, rep.datasets, slice_name))
        err.print(f"wrote {', '.join(rep.paths.values())}")
        if rep.regressions:
            raise typer.Exit(1)
