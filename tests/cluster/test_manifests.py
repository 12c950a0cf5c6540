"""Every deployment file validated without a cluster, and every check shown to fail on a planted error.

The manifests are rendered once per module (kustomize overlays), then each planted-error test mutates a
deep copy (or a copy of the files in tmp_path) and asserts the validator names the problem.
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))  # a repo tool, not part of the installed package

import validate_deploy as v  # noqa: E402
OVERLAYS = REPO / "k8s" / "overlays"


@pytest.fixture(scope="module")
def canonical() -> dict:
    return v.load_canonical_serve_config()


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: v.render_kustomization(OVERLAYS / name) for name in v.OVERLAYS}


def _one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    hits = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(hits) == 1, (kind, name, len(hits))
    return hits[0]


# ---------------------------------------------------------------- the real files pass


def test_whole_repo_validates():
    report = v.validate_repo()
    assert report.ok, "\n".join(report.problems)
    kinds = {w.split(": ", 1)[-1].split("/")[0] for w in report.checked}
    assert {"RayJob", "RayService", "PodMonitor", "ConfigMap", "PersistentVolumeClaim", "Namespace"} <= kinds


@pytest.mark.parametrize("overlay", sorted(v.OVERLAYS))
def test_overlay_yaml_parses_and_has_the_resources(overlay, rendered):
    docs = rendered[overlay]
    for d in docs:
        assert d["apiVersion"] and d["kind"] and d["metadata"]["name"]
    assert _one(docs, "RayJob")["apiVersion"] == "ray.io/v1"
    assert _one(docs, "RayService")["apiVersion"] == "ray.io/v1"
    assert {d["spec"]["selector"]["matchLabels"]["ray.io/node-type"] for d in docs if d["kind"] == "PodMonitor"} == {"head", "worker"}
    assert not [d for d in docs if d["kind"] == "ServiceMonitor"]
    job = _one(docs, "RayJob")["spec"]
    assert job["shutdownAfterJobFinishes"] is True and isinstance(job["ttlSecondsAfterFinished"], int)
    svc = _one(docs, "RayService")["spec"]
    assert svc["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    for g in svc["rayClusterConfig"]["workerGroupSpecs"]:
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]
    assert all(d["metadata"].get("namespace") == "qrag" for d in docs if d["kind"] != "Namespace")


def test_gpu_prod_has_gpu_groups_and_cpu_dev_none(rendered):
    for kind, key in (("RayJob", "rayClusterSpec"), ("RayService", "rayClusterConfig")):
        assert v.gpu_groups(_one(rendered["gpu-prod"], kind)["spec"][key]), kind
        assert not v.gpu_groups(_one(rendered["cpu-dev"], kind)["spec"][key]), kind
        gpu = v.gpu_groups(_one(rendered["gpu-prod"], kind)["spec"][key])[0]
        c = gpu["template"]["spec"]["containers"][0]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"


@pytest.mark.parametrize("overlay", sorted(v.OVERLAYS))
def test_renderer_matches_kubectl_kustomize(overlay, rendered):
    real = v.kubectl_kustomize(OVERLAYS / overlay)
    if real is None:
        pytest.skip("kubectl not installed (the renderer is still exercised by every other test)")
    assert v.canonical_docs(rendered[overlay]) == v.canonical_docs(real)


def test_serve_config_v2_is_the_canonical_serve_config(rendered, canonical):
    for docs in rendered.values():
        embedded = yaml.safe_load(_one(docs, "RayService")["spec"]["serveConfigV2"])
        assert embedded == canonical
    assert canonical["applications"][0]["import_path"] == "qrag_ray.serving.app:build_app"


def test_embed_serve_config_roundtrip_keeps_the_rest_of_the_file(tmp_path):
    rs = tmp_path / "rayservice.yaml"
    rs.write_text("# head comment\nkind: RayService\nspec:\n  serveConfigV2: |\n    old: 1\n  rayClusterConfig:\n    x: 1\n")
    sc = tmp_path / "serve.yaml"
    sc.write_text("# c\napplications:\n  - name: a\n    import_path: m:f\n")
    assert v.sync_serve_config(rs, sc) is True
    d = yaml.safe_load(rs.read_text())
    assert yaml.safe_load(d["spec"]["serveConfigV2"]) == {"applications": [{"name": "a", "import_path": "m:f"}]}
    assert d["spec"]["rayClusterConfig"] == {"x": 1}
    assert rs.read_text().startswith("# head comment\n")
    assert v.sync_serve_config(rs, sc) is False  # idempotent


def test_rayjob_entrypoint_parses_with_the_real_qrag_index():
    job = yaml.safe_load((REPO / "k8s" / "base" / "rayjob-index.yaml").read_text())
    sub, params = v.parse_entrypoint(job["spec"]["entrypoint"])
    assert sub == "index"
    assert params["address"] == "auto" and params["shards"] == 16 and params["format"] == "msmarco"


def test_cluster_launcher_validates_against_rays_schema():
    cfg = yaml.safe_load((REPO / "cluster" / "cloud-gpu.yaml").read_text())
    assert v.check_cluster_launcher(cfg) == []
    types = cfg["available_node_types"]
    assert types[cfg["head_node_type"]]["resources"]["CPU"] == 0
    assert any(t["resources"].get("GPU") for t in types.values())


def test_dockerfile_installs_the_gpu_extra():
    text = (REPO / "cluster" / "Dockerfile").read_text()
    assert "ARG EXTRA=gpu" in text and 'pip install ".[${EXTRA}]"' in text
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "gpu" in extras and "cpu" in extras


def test_dashboard_queries_only_exported_or_serve_metrics():
    from qrag_ray.serving.metrics import EXPORTED_METRICS

    dash = json.loads((REPO / "k8s" / "base" / "dashboards" / "qrag-dashboard.json").read_text())
    assert v.check_dashboard(dash, EXPORTED_METRICS) == []
    names = set().union(*(v.promql_metric_names(e) for e in v.dashboard_exprs(dash)))
    assert names & set(EXPORTED_METRICS), "the dashboard charts none of our metrics"
    assert any(n.startswith("ray_serve_") for n in names)


def test_promql_metric_names():
    e = ('histogram_quantile(0.95, sum by (le, shard) (rate(ray_qrag_x_bucket{tenant="a",le!="+Inf"}[5m]))) '
         '/ on (shard) group_left ray_y_total offset 5m')
    assert v.promql_metric_names(e) == {"ray_qrag_x_bucket", "ray_y_total"}


def test_cli_exit_codes(tmp_path, capsys):
    assert v.main([]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: ray.io/v1\nkind: RayJob\nmetadata: {name: j}\nspec: {entrypoint: qrag nope}\n")
    assert v.main([str(bad)]) == 1
    assert "not a qrag subcommand" in capsys.readouterr().err


# ---------------------------------------------------------------- planted errors fail


def _rayservice(rendered, overlay="gpu-prod") -> dict:
    return copy.deepcopy(_one(rendered[overlay], "RayService"))


def _set_serve(doc: dict, mutate) -> dict:
    cfg = yaml.safe_load(doc["spec"]["serveConfigV2"])
    mutate(cfg)
    doc["spec"]["serveConfigV2"] = yaml.safe_dump(cfg)
    return doc


def test_planted_wrong_import_path_fails(rendered):
    def wrong(cfg):
        cfg["applications"][0]["import_path"] = "qrag_ray.serving.app:build_ap"

    probs = v.check_rayservice(_set_serve(_rayservice(rendered), wrong), require_gpu=True, canonical=None)
    assert any("does not import" in p and "build_ap" in p for p in probs), probs

    def no_module(cfg):
        cfg["applications"][0]["import_path"] = "qrag_ray.servin.app:build_app"

    probs = v.check_rayservice(_set_serve(_rayservice(rendered), no_module), require_gpu=True, canonical=None)
    assert any("does not import" in p for p in probs), probs


def test_planted_serve_schema_violation_fails(rendered):
    def bad(cfg):
        cfg["applications"][0]["deployments"][0]["max_ongoing_requests"] = -3

    probs = v.check_rayservice(_set_serve(_rayservice(rendered), bad), require_gpu=True, canonical=None)
    assert any("ServeDeploySchema" in p for p in probs), probs


def test_planted_missing_autoscaling_fails(rendered):
    def fixed(cfg):
        dep = cfg["applications"][0]["deployments"][0]
        dep.pop("autoscaling_config")
        dep["num_replicas"] = 2

    probs = v.check_rayservice(_set_serve(_rayservice(rendered), fixed), require_gpu=True, canonical=None)
    assert any("no autoscaling_config" in p for p in probs), probs


def test_planted_drift_from_canonical_serve_config_fails(rendered, canonical):
    def drift(cfg):
        cfg["applications"][0]["args"]["shards"] = 5

    probs = v.check_rayservice(_set_serve(_rayservice(rendered), drift), require_gpu=True, canonical=canonical)
    assert any("differs from serve_configs/qrag.yaml" in p for p in probs), probs


def test_every_rayservice_pod_carries_the_tuned_serve_env(rendered):
    doc = _rayservice(rendered)
    assert v.check_serve_env(doc) == []
    worker = doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    worker["env"] = [e for e in worker["env"] if e["name"] != "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"]
    probs = v.check_rayservice(doc, require_gpu=True, canonical=None)
    assert any("RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD" in p and "worker" in p for p in probs), probs


def test_planted_missing_gpu_limit_and_autoscaling_fail(rendered):
    doc = _rayservice(rendered)
    spec = doc["spec"]["rayClusterConfig"]
    for g in v.gpu_groups(spec):
        for c in g["template"]["spec"]["containers"]:
            c["resources"]["limits"].pop("nvidia.com/gpu")
    spec["enableInTreeAutoscaling"] = False
    spec["workerGroupSpecs"][0]["minReplicas"] = 99
    probs = v.check_rayservice(doc, require_gpu=True, canonical=None)
    assert any("nvidia.com/gpu" in p for p in probs)
    assert any("enableInTreeAutoscaling" in p for p in probs)
    assert any("minReplicas" in p for p in probs)


def test_planted_cluster_too_small_for_the_app(rendered):
    doc = _rayservice(rendered, "cpu-dev")
    doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplicas"] = 2
    doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replicas"] = 1
    doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["minReplicas"] = 1
    doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "2"
    probs = v.check_rayservice(doc, require_gpu=False, canonical=None)
    assert any("CPUs at min_replicas" in p for p in probs), probs


@pytest.mark.parametrize("entrypoint, expect", [
    ("qrag index --input /mnt/qrag/c.jsonl --output /mnt/qrag/i --shardz 4", "No such option: --shardz"),
    ("qrag index --input /mnt/qrag/c.jsonl --output /mnt/qrag/i --shards four", "Invalid value for '--shards'"),
    ("qrag index --input /mnt/qrag/c.jsonl", "--output"),
    ("qrag indexx --input a --output b", "not a qrag subcommand"),
    ("python build.py", "must run `qrag <subcommand>`"),
    ("qrag index --input /tmp/c.jsonl --output /mnt/qrag/i", "not on a shared volume"),
    ("qrag index --input /mnt/qrag/c.jsonl --output /mnt/qrag/i --config /etc/other/x.yaml", "not in a ConfigMap volume"),
])
def test_planted_bad_entrypoint_fails(rendered, entrypoint, expect):
    docs = copy.deepcopy(rendered["gpu-prod"])
    job = _one(docs, "RayJob")
    job["spec"]["entrypoint"] = entrypoint
    cms = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    probs = v.check_rayjob(job, require_gpu=True, configmaps=cms)
    assert any(expect in p for p in probs), probs


def test_planted_invalid_index_config_fails(rendered):
    docs = copy.deepcopy(rendered["cpu-dev"])
    cm = _one(docs, "ConfigMap", "qrag-index-config")
    cm["data"]["index.yaml"] = cm["data"]["index.yaml"].replace("questions: 10", "questionz: 10")
    probs = v.check_rayjob(_one(docs, "RayJob"), require_gpu=False,
                           configmaps={d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"})
    assert any("questionz" in p for p in probs), probs


def test_planted_rayjob_lifecycle_errors_fail(rendered):
    job = copy.deepcopy(_one(rendered["cpu-dev"], "RayJob"))
    job["spec"]["shutdownAfterJobFinishes"] = False
    job["spec"].pop("ttlSecondsAfterFinished")
    probs = v.check_rayjob(job, require_gpu=False, configmaps={})
    assert any("shutdownAfterJobFinishes" in p for p in probs)
    assert any("ttlSecondsAfterFinished" in p for p in probs)


def test_planted_metric_not_exported_fails():
    from qrag_ray.serving.metrics import EXPORTED_METRICS

    dash = json.loads((REPO / "k8s" / "base" / "dashboards" / "qrag-dashboard.json").read_text())
    dash["panels"][0]["targets"][0]["expr"] = "sum(rate(ray_qrag_requests_total[5m]))"
    probs = v.check_dashboard(dash, EXPORTED_METRICS)
    assert any("ray_qrag_requests_total" in p for p in probs), probs


def test_planted_servicemonitor_and_port_mismatch_fail(rendered):
    docs = copy.deepcopy(rendered["gpu-prod"])
    pm = _one(docs, "PodMonitor", "qrag-ray-head")
    pm["kind"] = "ServiceMonitor"
    probs = v.check_podmonitors(docs)
    assert any("not a ServiceMonitor" in p for p in probs)
    assert any("no PodMonitor selects Ray head pods" in p for p in probs)
    docs = copy.deepcopy(rendered["gpu-prod"])
    _one(docs, "RayService")["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]["metrics-export-port"] = "9090"
    assert any("metrics-export-port" in p for p in v.check_podmonitors(docs))


def test_planted_cluster_launcher_errors_fail():
    cfg = yaml.safe_load((REPO / "cluster" / "cloud-gpu.yaml").read_text())
    bad = copy.deepcopy(cfg)
    bad["available_node_types"]["gpu_worker"]["min_wokers"] = 1  # typo: the schema forbids extra fields
    assert any("schema" in p for p in v.check_cluster_launcher(bad))
    bad = copy.deepcopy(cfg)
    bad["available_node_types"]["head"]["resources"] = {"CPU": 8, "GPU": 1}
    assert any("CPU-only" in p for p in v.check_cluster_launcher(bad))
    bad = copy.deepcopy(cfg)
    del bad["available_node_types"]["gpu_worker"]
    assert any("no GPU worker type" in p for p in v.check_cluster_launcher(bad))


def test_planted_error_in_a_file_copy_fails_the_overlay(tmp_path, canonical):
    """The whole path: a typo in a copied manifest file makes validate_overlay fail."""
    shutil.copytree(REPO / "k8s", tmp_path / "k8s")
    job = tmp_path / "k8s" / "overlays" / "gpu-prod" / "rayjob-gpu.yaml"  # the overlay sets the entrypoint
    assert "--cache-dir" in job.read_text()
    job.write_text(job.read_text().replace("--cache-dir", "--cache-directory"))
    report = v.validate_overlay(tmp_path / "k8s" / "overlays" / "gpu-prod", require_gpu=True, canonical_serve=canonical)
    assert not report.ok and any("No such option: --cache-directory" in p for p in report.problems), report.problems
    clean = v.validate_overlay(REPO / "k8s" / "overlays" / "gpu-prod", require_gpu=True, canonical_serve=canonical)
    assert clean.ok, clean.problems
