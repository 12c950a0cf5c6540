"""`qrag serve` / `qrag query` / `qrag tenants` user errors: one line on stderr, exit 2, no traceback."""

from __future__ import annotations

import pytest

from qrag_ray.cli import main
from qrag_ray.serving.tenants import hash_key, load_tenants


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def fake_index(tmp_path):
    """Just enough of an index for `qrag tenants add` (it checks the manifest is readable)."""
    import json

    index_dir = tmp_path / "idx"
    index_dir.mkdir()
    (index_dir / "manifest.json").write_text(json.dumps({
        "format_version": 1, "index_version": "v", "num_shards": 1, "embedder": {"model": "m", "dim": 3},
        "shards": [{"id": 0, "faiss": "shards/00000.faiss", "meta": "shards/00000.parquet", "vectors": 0,
                    "vectors_before_filters": 0, "chunks": 0, "kinds": {}, "seconds": 0.0}],
        "files": {}, "representation": "chunk"}))
    return index_dir


def test_tenants_add_prints_the_key_once_and_stores_its_hash(tmp_path, fake_index, capsys):
    tenants_file = tmp_path / "tenants.yaml"
    argv = ["tenants", "add", "--file", str(tenants_file), "--name", "acme", "--index", str(fake_index)]
    code, out, err = run(argv, capsys)
    assert code == 0
    key = out.strip()
    assert key.startswith("qrag_") and key not in tenants_file.read_text()
    assert load_tenants(tenants_file).by_name["acme"].key_sha256 == hash_key(key)
    code, out, _ = run(["tenants", "list", "--file", str(tenants_file)], capsys)
    assert code == 0 and out.startswith("acme\t") and key not in out


@pytest.mark.parametrize("argv,message", [
    (["tenants", "add", "--file", "{tmp}/t.yaml", "--name", "a", "--index", "{tmp}/missing"], "index not found"),
    (["tenants", "add", "--file", "{tmp}/t.yaml", "--name", "a b", "--index", "{idx}"], "tenant names"),
    (["serve", "--index", "{tmp}/missing"], "index not found"),
    (["serve"], "give --index DIR or --tenants FILE"),
    (["serve", "--tenants", "{tmp}/missing.yaml"], "tenants file not found"),
    (["serve", "--config", "{tmp}/bad.yaml", "--index", "{idx}"], "Serve schema"),
    (["serve", "--config", "{tmp}/missing.yaml"], "serve config not found"),
    (["query", "--url", "http://127.0.0.1:9", "how?"], "cannot reach"),
])
def test_user_errors_are_one_line(tmp_path, fake_index, capsys, argv, message):
    (tmp_path / "bad.yaml").write_text("applications:\n  - name: qrag\n    import_path: 3\n    bogus: 1\n")
    argv = [a.format(tmp=tmp_path, idx=fake_index) for a in argv]
    code, out, err = run(argv, capsys)
    assert code == 2, err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 3  # one message (rich may wrap it)


def test_flags_override_the_serve_config(tmp_path):
    import yaml

    from qrag_ray.cli.serve_cmd import load_serve_config, plan_from_config

    data = load_serve_config("serve_configs/qrag.yaml")
    args, deployments, http = plan_from_config(data, str(tmp_path), None, "http://llm:9/v1", "m")
    assert args["index"] == str(tmp_path.resolve()) and "tenants" not in args
    assert args["generator"]["base_url"] == "http://llm:9/v1" and args["generator"]["model"] == "m"
    with open("serve_configs/qrag.yaml") as config_file:
        written = yaml.safe_load(config_file)
    assert args["shards"] == written["applications"][0]["args"]["shards"]
    assert set(deployments) >= {"Router", "ShardSearcher0"} and "QueryEmbedder" not in deployments
    assert http["port"] == 8000
    args, _, _ = plan_from_config(None, None, str(tmp_path / "t.yaml"), None, None)
    assert args == {"tenants": str((tmp_path / "t.yaml").resolve())}
