"""Every deployment file validated without a cluster, and every check shown to fail on a planted error.

The manifests are rendered once per module (kustomize overlays), then each planted-error test mutates a
deep copy (or a copy of the files in tmp_path) and asserts the validator names the problem.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import yaml

from tools.validate_deploy import kuberay, launcher, monitoring, security, serve
from tools.validate_deploy.cli import OVERLAYS as OVERLAY_NAMES
from tools.validate_deploy.cli import main, validate_docs, validate_overlay, validate_repo
from tools.validate_deploy.render import RenderError, render_kustomization

REPO = Path(__file__).resolve().parents[2]
OVERLAYS = REPO / "k8s" / "overlays"


@pytest.fixture(scope="module")
def canonical() -> dict:
    return serve.load_canonical_serve_config()


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: render_kustomization(OVERLAYS / name) for name in OVERLAY_NAMES}


def _one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    hits = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(hits) == 1, (kind, name, len(hits))
    return hits[0]


# ---------------------------------------------------------------- the real files pass


def test_whole_repo_validates():
    report = validate_repo()
    assert report.ok, "\n".join(report.problems)
    kinds = {w.split(": ", 1)[-1].split("/")[0] for w in report.checked}
    assert {"RayJob", "RayService", "PodMonitor", "ConfigMap", "PersistentVolumeClaim", "Namespace",
            "NetworkPolicy"} <= kinds


@pytest.mark.parametrize("overlay", sorted(OVERLAY_NAMES))
def test_overlay_yaml_parses_and_has_the_resources(overlay, rendered):
    docs = rendered[overlay]
    for doc in docs:
        assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"]
    assert _one(docs, "RayJob")["apiVersion"] == "ray.io/v1"
    assert _one(docs, "RayService")["apiVersion"] == "ray.io/v1"
    assert {d["spec"]["selector"]["matchLabels"]["ray.io/node-type"] for d in docs
            if d["kind"] == "PodMonitor"} == {"head", "worker"}
    assert not [d for d in docs if d["kind"] == "ServiceMonitor"]
    job = _one(docs, "RayJob")["spec"]
    assert job["shutdownAfterJobFinishes"] is True and isinstance(job["ttlSecondsAfterFinished"], int)
    svc = _one(docs, "RayService")["spec"]
    assert svc["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    for group in svc["rayClusterConfig"]["workerGroupSpecs"]:
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    assert all(d["metadata"].get("namespace") == "qrag" for d in docs if d["kind"] != "Namespace")


def test_gpu_prod_has_gpu_groups_and_cpu_dev_none(rendered):
    for kind, key in (("RayJob", "rayClusterSpec"), ("RayService", "rayClusterConfig")):
        assert kuberay.gpu_groups(_one(rendered["gpu-prod"], kind)["spec"][key]), kind
        assert not kuberay.gpu_groups(_one(rendered["cpu-dev"], kind)["spec"][key]), kind
        gpu = kuberay.gpu_groups(_one(rendered["gpu-prod"], kind)["spec"][key])[0]
        container = gpu["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_serve_config_v2_is_the_canonical_serve_config(rendered, canonical):
    for docs in rendered.values():
        embedded = yaml.safe_load(_one(docs, "RayService")["spec"]["serveConfigV2"])
        assert embedded == canonical
    assert canonical["applications"][0]["import_path"] == "qrag_ray.serving.application:build_app"


def test_embed_serve_config_roundtrip_keeps_the_rest_of_the_file(tmp_path):
    rayservice = tmp_path / "rayservice.yaml"
    rayservice.write_text("# head comment\nkind: RayService\nspec:\n  serveConfigV2: |\n    old: 1\n  "
                          "rayClusterConfig:\n    x: 1\n")
    serve_config = tmp_path / "serve.yaml"
    serve_config.write_text("# c\napplications:\n  - name: a\n    import_path: m:f\n")
    assert serve.sync_serve_config(rayservice, serve_config) is True
    doc = yaml.safe_load(rayservice.read_text())
    assert yaml.safe_load(doc["spec"]["serveConfigV2"]) == {"applications": [{"name": "a", "import_path": "m:f"}]}
    assert doc["spec"]["rayClusterConfig"] == {"x": 1}
    assert rayservice.read_text().startswith("# head comment\n")
    assert serve.sync_serve_config(rayservice, serve_config) is False  # idempotent


def test_rayjob_entrypoint_parses_with_the_real_qrag_index():
    job = yaml.safe_load((REPO / "k8s" / "base" / "rayjob-index.yaml").read_text())
    sub, params = kuberay.parse_entrypoint(job["spec"]["entrypoint"])
    assert sub == "index"
    assert params["address"] == "auto" and params["shards"] == 16 and params["format"] == "msmarco"


def test_cluster_launcher_validates_against_rays_schema():
    cfg = yaml.safe_load((REPO / "cluster" / "cloud-gpu.yaml").read_text())
    assert launcher.check_cluster_launcher(cfg) == []
    types = cfg["available_node_types"]
    assert types[cfg["head_node_type"]]["resources"]["CPU"] == 0
    assert any(t["resources"].get("GPU") for t in types.values())


def test_dockerfile_installs_the_gpu_extra():
    text = (REPO / "cluster" / "Dockerfile").read_text()
    assert "ARG EXTRA=gpu" in text and 'RUN cluster/install_image.sh install "${EXTRA}"' in text
    assert "COPY --chown=ray:users clients/python ./clients/python" in text
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "gpu" in extras and "cpu" in extras


def test_dashboard_queries_only_exported_or_serve_metrics():
    from qrag_ray.serving.app_metrics import EXPORTED_METRICS

    dash = json.loads((REPO / "k8s" / "base" / "dashboards" / "qrag-dashboard.json").read_text())
    assert monitoring.check_dashboard(dash, EXPORTED_METRICS) == []
    names = set().union(*(monitoring.promql_metric_names(e) for e in monitoring.dashboard_exprs(dash)))
    assert names & set(EXPORTED_METRICS), "the dashboard charts none of our metrics"
    assert any(n.startswith("ray_serve_") for n in names)


def test_promql_metric_names():
    expr = ('histogram_quantile(0.95, sum by (le, shard) (rate(ray_qrag_x_bucket{tenant="a",le!="+Inf"}[5m]))) '
            '/ on (shard) group_left ray_y_total offset 5m + sum({__name__="ray_z"})')
    assert monitoring.promql_metric_names(expr) == {"ray_qrag_x_bucket", "ray_y_total", "ray_z"}
    with pytest.raises(ValueError, match="not PromQL"):
        monitoring.promql_metric_names("sum(rate(ray_qrag_x[5m])")


def test_planted_unparseable_query_fails():
    from qrag_ray.serving.app_metrics import EXPORTED_METRICS

    dash = json.loads((REPO / "k8s" / "base" / "dashboards" / "qrag-dashboard.json").read_text())
    dash["panels"][0]["targets"][0]["expr"] = "sum by (route (rate(ray_qrag_request_latency_ms_count[5m]))"
    assert any("not PromQL" in p for p in monitoring.check_dashboard(dash, EXPORTED_METRICS))


def test_cli_exit_codes(tmp_path, capsys):
    assert main([]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: ray.io/v1\nkind: RayJob\nmetadata: {name: j}\nspec: {entrypoint: qrag nope}\n")
    assert main([str(bad)]) == 1
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
        cfg["applications"][0]["import_path"] = "qrag_ray.serving.application:build_ap"

    probs = kuberay.check_rayservice(_set_serve(_rayservice(rendered), wrong), require_gpu=True, canonical=None)
    assert any("does not import" in p and "build_ap" in p for p in probs), probs

    def no_module(cfg):
        cfg["applications"][0]["import_path"] = "qrag_ray.servin.app:build_app"

    probs = kuberay.check_rayservice(_set_serve(_rayservice(rendered), no_module), require_gpu=True, canonical=None)
    assert any("does not import" in p for p in probs), probs


def test_planted_serve_schema_violation_fails(rendered):
    def bad(cfg):
        cfg["applications"][0]["deployments"][0]["max_ongoing_requests"] = -3

    probs = kuberay.check_rayservice(_set_serve(_rayservice(rendered), bad), require_gpu=True, canonical=None)
    assert any("ServeDeploySchema" in p for p in probs), probs


def test_planted_missing_autoscaling_fails(rendered):
    def fixed(cfg):
        dep = cfg["applications"][0]["deployments"][0]
        dep.pop("autoscaling_config")
        dep["num_replicas"] = 2

    probs = kuberay.check_rayservice(_set_serve(_rayservice(rendered), fixed), require_gpu=True, canonical=None)
    assert any("no autoscaling_config" in p for p in probs), probs


def test_planted_shard_searcher_on_serves_default_policy_fails(rendered):
    def default_policy(cfg):
        searcher = next(d for d in cfg["applications"][0]["deployments"] if d["name"] == "ShardSearcher1")
        searcher["autoscaling_config"].pop("policy")

    probs = kuberay.check_rayservice(_set_serve(_rayservice(rendered), default_policy), require_gpu=True,
                                     canonical=None)
    assert any("ShardSearcher1" in p and "ShardSearcherPolicy" in p for p in probs), probs


def test_planted_drift_from_canonical_serve_config_fails(rendered, canonical):
    def drift(cfg):
        cfg["applications"][0]["args"]["shards"] = 5

    probs = kuberay.check_rayservice(_set_serve(_rayservice(rendered), drift), require_gpu=True, canonical=canonical)
    assert any("differs from serve_configs/qrag.yaml" in p for p in probs), probs


def test_every_rayservice_pod_carries_the_tuned_serve_env(rendered):
    doc = _rayservice(rendered)
    assert kuberay.check_serve_env(doc) == []
    worker = doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    worker["env"] = [e for e in worker["env"] if e["name"] != "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"]
    probs = kuberay.check_rayservice(doc, require_gpu=True, canonical=None)
    assert any("RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD" in p and "worker" in p for p in probs), probs


def test_every_rayservice_pod_runs_haproxy_with_the_serve_configs_timeout(rendered):
    doc = _rayservice(rendered)
    head = doc["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    head["env"] = [e for e in head["env"] if e["name"] != "RAY_SERVE_ENABLE_HA_PROXY"]
    probs = kuberay.check_rayservice(doc, require_gpu=True, canonical=None)
    assert any("RAY_SERVE_ENABLE_HA_PROXY" in p and "head" in p for p in probs), probs

    def longer(cfg):
        cfg["http_options"]["request_timeout_s"] = 90

    probs = kuberay.check_rayservice(_set_serve(_rayservice(rendered), longer), require_gpu=True, canonical=None)
    assert any("request_timeout_s is 90" in p and "server timeout" in p for p in probs), probs


def test_planted_missing_gpu_limit_and_autoscaling_fail(rendered):
    doc = _rayservice(rendered)
    spec = doc["spec"]["rayClusterConfig"]
    for group in kuberay.gpu_groups(spec):
        for container in group["template"]["spec"]["containers"]:
            container["resources"]["limits"].pop("nvidia.com/gpu")
    spec["enableInTreeAutoscaling"] = False
    spec["workerGroupSpecs"][0]["minReplicas"] = 99
    probs = kuberay.check_rayservice(doc, require_gpu=True, canonical=None)
    assert any("nvidia.com/gpu" in p for p in probs)
    assert any("enableInTreeAutoscaling" in p for p in probs)
    assert any("minReplicas" in p for p in probs)


def test_planted_cluster_too_small_for_the_app(rendered):
    doc = _rayservice(rendered, "cpu-dev")
    doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplicas"] = 2
    doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replicas"] = 1
    doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["minReplicas"] = 1
    worker = doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    worker["resources"]["limits"]["cpu"] = "2"
    probs = kuberay.check_rayservice(doc, require_gpu=False, canonical=None)
    assert any("CPUs at min_replicas" in p for p in probs), probs


@pytest.mark.parametrize("entrypoint, expect", [
    ("qrag index --input /mnt/qrag/c.jsonl --output /mnt/qrag/i --shardz 4", "No such option: --shardz"),
    ("qrag index --input /mnt/qrag/c.jsonl --output /mnt/qrag/i --shards four", "Invalid value for '--shards'"),
    ("qrag index --input /mnt/qrag/c.jsonl", "--output"),
    ("qrag indexx --input a --output b", "not a qrag subcommand"),
    ("python build.py", "must run `qrag <subcommand>`"),
    ("qrag index --input /tmp/c.jsonl --output /mnt/qrag/i", "not on a shared volume"),
    ("qrag index --input /mnt/qrag/c.jsonl --output /mnt/qrag/i --config /etc/other/x.yaml",
     "not in a ConfigMap volume"),
])
def test_planted_bad_entrypoint_fails(rendered, entrypoint, expect):
    docs = copy.deepcopy(rendered["gpu-prod"])
    job = _one(docs, "RayJob")
    job["spec"]["entrypoint"] = entrypoint
    cms = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    probs = kuberay.check_rayjob(job, require_gpu=True, configmaps=cms)
    assert any(expect in p for p in probs), probs


def test_planted_invalid_index_config_fails(rendered):
    docs = copy.deepcopy(rendered["cpu-dev"])
    configmap = _one(docs, "ConfigMap", "qrag-index-config")
    configmap["data"]["index.yaml"] = configmap["data"]["index.yaml"].replace("questions: 10", "questionz: 10")
    probs = kuberay.check_rayjob(_one(docs, "RayJob"), require_gpu=False,
                           configmaps={d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"})
    assert any("questionz" in p for p in probs), probs


def test_planted_rayjob_lifecycle_errors_fail(rendered):
    job = copy.deepcopy(_one(rendered["cpu-dev"], "RayJob"))
    job["spec"]["shutdownAfterJobFinishes"] = False
    job["spec"].pop("ttlSecondsAfterFinished")
    probs = kuberay.check_rayjob(job, require_gpu=False, configmaps={})
    assert any("shutdownAfterJobFinishes" in p for p in probs)
    assert any("ttlSecondsAfterFinished" in p for p in probs)


def test_planted_metric_not_exported_fails():
    from qrag_ray.serving.app_metrics import EXPORTED_METRICS

    dash = json.loads((REPO / "k8s" / "base" / "dashboards" / "qrag-dashboard.json").read_text())
    dash["panels"][0]["targets"][0]["expr"] = "sum(rate(ray_qrag_requests_total[5m]))"
    probs = monitoring.check_dashboard(dash, EXPORTED_METRICS)
    assert any("ray_qrag_requests_total" in p for p in probs), probs


def test_planted_servicemonitor_and_port_mismatch_fail(rendered):
    docs = copy.deepcopy(rendered["gpu-prod"])
    monitor = _one(docs, "PodMonitor", "qrag-ray-head")
    monitor["kind"] = "ServiceMonitor"
    probs = monitoring.check_podmonitors(docs)
    assert any("not a ServiceMonitor" in p for p in probs)
    assert any("no PodMonitor selects Ray head pods" in p for p in probs)
    docs = copy.deepcopy(rendered["gpu-prod"])
    head = _one(docs, "RayService")["spec"]["rayClusterConfig"]["headGroupSpec"]
    head["rayStartParams"]["metrics-export-port"] = "9090"
    assert any("metrics-export-port" in p for p in monitoring.check_podmonitors(docs))


def test_planted_cluster_launcher_errors_fail():
    cfg = yaml.safe_load((REPO / "cluster" / "cloud-gpu.yaml").read_text())
    bad = copy.deepcopy(cfg)
    bad["available_node_types"]["gpu_worker"]["min_wokers"] = 1  # typo: the schema forbids extra fields
    assert any("schema" in p for p in launcher.check_cluster_launcher(bad))
    bad = copy.deepcopy(cfg)
    bad["available_node_types"]["head"]["resources"] = {"CPU": 8, "GPU": 1}
    assert any("CPU-only" in p for p in launcher.check_cluster_launcher(bad))
    bad = copy.deepcopy(cfg)
    del bad["available_node_types"]["gpu_worker"]
    assert any("no GPU worker type" in p for p in launcher.check_cluster_launcher(bad))


def test_planted_error_in_a_file_copy_fails_the_overlay(tmp_path, canonical):
    """The whole path: a typo in a copied manifest file makes validate_overlay fail."""
    shutil.copytree(REPO / "k8s", tmp_path / "k8s")
    job = tmp_path / "k8s" / "overlays" / "gpu-prod" / "rayjob-gpu.yaml"  # the overlay sets the entrypoint
    assert "--cache-dir" in job.read_text()
    job.write_text(job.read_text().replace("--cache-dir", "--cache-directory"))
    report = validate_overlay(tmp_path / "k8s" / "overlays" / "gpu-prod", require_gpu=True, canonical_serve=canonical)
    assert not report.ok and any("No such option: --cache-directory" in p for p in report.problems), report.problems
    clean = validate_overlay(REPO / "k8s" / "overlays" / "gpu-prod", require_gpu=True, canonical_serve=canonical)
    assert clean.ok, clean.problems


def test_render_error_is_a_problem_not_a_crash(tmp_path):
    shutil.copytree(REPO / "k8s", tmp_path / "k8s")
    (tmp_path / "k8s" / "base" / "kustomization.yaml").write_text(
        (tmp_path / "k8s" / "base" / "kustomization.yaml").read_text().replace("rayservice.yaml", "rayservce.yaml"))
    with pytest.raises(RenderError):
        render_kustomization(tmp_path / "k8s" / "overlays" / "cpu-dev")
    report = validate_overlay(tmp_path / "k8s" / "overlays" / "cpu-dev", require_gpu=False)
    assert not report.ok and "cannot render" in report.problems[0] and "rayservce.yaml" in report.problems[0]


# ---------------------------------------------------------------- the lock-down (security.py)


def _ray_docs(rendered, overlay="gpu-prod"):
    return [d for d in rendered[overlay] if d["kind"] in ("RayJob", "RayService")]


@pytest.mark.parametrize("overlay", sorted(OVERLAY_NAMES))
def test_every_overlay_is_locked_down(overlay, rendered):
    docs = rendered[overlay]
    assert security.check_manifests(docs) == []
    for doc in _ray_docs(rendered, overlay):
        assert security.check_ray_resource(doc) == [], doc["kind"]
        assert security.cluster_spec(doc)["authOptions"] == {"mode": "token"}
    namespace = _one(docs, "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    svc = _one(docs, "RayService")
    assert security.serve_tenants_paths(svc) == ["/etc/qrag/tenants/tenants.yaml"]


def test_planted_manifest_without_token_auth_fails(rendered):
    for doc in _ray_docs(rendered):
        doc = copy.deepcopy(doc)
        security.cluster_spec(doc).pop("authOptions")
        assert any("token authentication is off" in p for p in security.check_ray_resource(doc)), doc["kind"]
    doc = copy.deepcopy(_one(rendered["cpu-dev"], "RayService"))
    security.cluster_spec(doc)["rayVersion"] = "2.47.1"
    assert any("has no token authentication" in p for p in security.check_token_auth(doc))
    doc = copy.deepcopy(_one(rendered["cpu-dev"], "RayJob"))
    worker = security.cluster_spec(doc)["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    worker.setdefault("env", []).append({"name": "RAY_AUTH_MODE", "value": "disabled"})
    assert any("overrides authOptions" in p for p in security.check_token_auth(doc))


@pytest.mark.parametrize("plant, expect", [
    (lambda pod, c: [pod["securityContext"].pop("runAsNonRoot"), c["securityContext"].pop("runAsNonRoot")],
     "may run as root"),
    (lambda pod, c: c["securityContext"].update(runAsUser=0), "runAsUser 0 is root"),
    (lambda pod, c: c["securityContext"].pop("allowPrivilegeEscalation"), "allowPrivilegeEscalation"),
    (lambda pod, c: c["securityContext"].update(capabilities={"add": ["SYS_ADMIN"]}), "capabilities must drop ALL"),
    (lambda pod, c: c["securityContext"].update(readOnlyRootFilesystem=False), "readOnlyRootFilesystem"),
    (lambda pod, c: pod.pop("securityContext") and c["securityContext"].update(runAsNonRoot=True), "seccompProfile"),
    (lambda pod, c: c.pop("securityContext"), "allowPrivilegeEscalation must be false"),
    (lambda pod, c: c.update(volumeMounts=[m for m in c["volumeMounts"] if m["mountPath"] != "/tmp"]),
     "no writable emptyDir at /tmp"),
    (lambda pod, c: pod["volumes"].append({"name": "host", "hostPath": {"path": "/"}}), "hostPath"),
    (lambda pod, c: pod.update(hostNetwork=True), "hostNetwork is on"),
], ids=["root", "uid0", "escalation", "caps", "rw-root", "seccomp", "no-container-sc", "no-tmp", "hostpath", "hostnet"])
def test_planted_container_that_may_run_as_root_or_write_its_root_fails(rendered, plant, expect):
    for kind in ("RayJob", "RayService"):
        doc = copy.deepcopy(_one(rendered["gpu-prod"], kind))
        pod = security.cluster_spec(doc)["workerGroupSpecs"][-1]["template"]["spec"]
        plant(pod, pod["containers"][0])
        probs = security.check_pod_security(doc)
        assert any(expect in p and "worker group" in p for p in probs), (kind, probs)


def test_planted_autoscaler_and_submitter_without_security_context_fail(rendered):
    doc = copy.deepcopy(_one(rendered["cpu-dev"], "RayJob"))
    security.cluster_spec(doc)["autoscalerOptions"].pop("securityContext")
    doc["spec"]["submitterPodTemplate"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = False
    probs = security.check_pod_security(doc)
    assert any(p.startswith("autoscaler sidecar") and "allowPrivilegeEscalation" in p for p in probs), probs
    assert any("submitter pod" in p and "readOnlyRootFilesystem" in p for p in probs), probs
    doc["spec"].pop("submitterPodTemplate")
    assert any("no submitterPodTemplate" in p for p in security.check_pod_security(doc))


def test_planted_namespace_without_restricted_pod_security_fails(rendered):
    docs = copy.deepcopy(rendered["cpu-dev"])
    _one(docs, "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] = "privileged"
    assert any("must be restricted" in p for p in security.check_namespace(docs))


def _policies_replaced(rendered, *policies) -> list[dict]:
    docs = [d for d in copy.deepcopy(rendered["gpu-prod"]) if d["kind"] != "NetworkPolicy"]
    return docs + [{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": f"p{i}"},
                    "spec": spec} for i, spec in enumerate(policies)]


def test_planted_manifests_without_network_policies_fail(rendered):
    probs = security.check_manifests(_policies_replaced(rendered))
    assert any("no default-deny ingress NetworkPolicy" in p for p in probs)
    assert any("RayService qrag head pod: no NetworkPolicy selects it" in p for p in probs), probs
    assert any("RayJob qrag-index submitter pod: no NetworkPolicy selects it" in p for p in probs), probs
    assert any("Serve port 8000" in p for p in probs)


@pytest.mark.parametrize("rule, target, expect", [
    ({"ports": [{"port": 6379}]}, {"matchLabels": {"ray.io/node-type": "head"}}, "opens ports [6379] to any address"),
    ({}, {"matchLabels": {"app.kubernetes.io/component": "qrag-serve"}}, "opens every port to any address"),
    ({"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": 8265}]}, {}, "to any address"),
    ({"from": [{"namespaceSelector": {}}]}, {"matchLabels": {"app.kubernetes.io/component": "qrag-index"}},
     "opens every port to another namespace"),
    ({"from": [{"namespaceSelector": {}}], "ports": [{"port": 8265}]}, {"matchLabels": {"ray.io/node-type": "worker"}},
     "to another namespace"),
    ({"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/component": "qrag-serve"}}}]},
     {"matchLabels": {"app.kubernetes.io/component": "qrag-index"}}, "outside its Ray cluster (['qrag-serve'])"),
    ({"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/component": "qrag-index-submitter"}}}],
      "ports": [{"port": 10001}]}, {"matchLabels": {"ray.io/node-type": "head"}}, "outside its Ray cluster"),
])
def test_planted_policy_that_opens_ray_ports_fails(rendered, rule, target, expect):
    base = [d["spec"] for d in rendered["gpu-prod"] if d["kind"] == "NetworkPolicy"]
    docs = _policies_replaced(rendered, *base, {"podSelector": target, "policyTypes": ["Ingress"], "ingress": [rule]})
    probs = security.check_network_policies(docs)
    assert any(expect in p for p in probs), probs


def test_label_selector_semantics():
    labels = {"app.kubernetes.io/component": "qrag-serve", "ray.io/node-type": "head"}
    assert security.selector_matches({}, labels)
    assert security.selector_matches({"matchLabels": {"ray.io/node-type": "head"}}, labels)
    assert not security.selector_matches({"matchLabels": {"ray.io/node-type": "worker"}}, labels)
    expr = {"matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "In", "values": ["qrag-index"]}]}
    assert not security.selector_matches(expr, labels)
    assert security.selector_matches({"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]}, labels)
    assert not security.selector_matches({"matchExpressions": [{"key": "x", "operator": "Exists"}]}, labels)


@pytest.mark.parametrize("volume, expect", [
    ({"name": "tenants", "configMap": {"name": "qrag-tenants"}}, "comes from a configMap volume, not a Secret"),
    ({"name": "tenants", "persistentVolumeClaim": {"claimName": "qrag-data"}}, "persistentVolumeClaim volume"),
    (None, "is on no mounted volume"),
])
def test_planted_tenants_not_from_a_secret_fails(rendered, volume, expect):
    doc = copy.deepcopy(_one(rendered["cpu-dev"], "RayService"))
    pod = security.cluster_spec(doc)["workerGroupSpecs"][0]["template"]["spec"]
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "tenants"] + ([volume] if volume else [])
    if volume is None:
        container = pod["containers"][0]
        container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "tenants"]
    probs = security.check_ray_resource(doc)
    assert any(expect in p and "worker group" in p for p in probs), probs


def test_planted_launcher_without_token_auth_fails():
    cfg = yaml.safe_load((REPO / "cluster" / "cloud-gpu.yaml").read_text())
    assert launcher.check_launcher_auth(cfg) == []
    bad = copy.deepcopy(cfg)
    bad["worker_start_ray_commands"] = [c.replace("RAY_AUTH_MODE=token ", "") for c in bad["worker_start_ray_commands"]]
    assert any("worker_start_ray_commands: `ray start` without RAY_AUTH_MODE=token" in p
               for p in launcher.check_cluster_launcher(bad))
    bad = copy.deepcopy(cfg)
    bad["head_start_ray_commands"] = [c.replace("--num-cpus=0", "--num-cpus=0 --dashboard-host=0.0.0.0")
                                      for c in bad["head_start_ray_commands"]]
    assert any("listens on 0.0.0.0" in p for p in launcher.check_launcher_auth(bad))
    bad = copy.deepcopy(cfg)
    bad["file_mounts"] = {}
    assert any("token is not copied" in p for p in launcher.check_launcher_auth(bad))


def test_planted_manifest_file_without_auth_fails_the_overlay(tmp_path):
    """The whole path the CI check takes: a base file edited to drop token auth and the policies makes
    the rendered overlay fail."""
    shutil.copytree(REPO / "k8s", tmp_path / "k8s")
    rayservice = tmp_path / "k8s" / "base" / "rayservice.yaml"
    rayservice.write_text(rayservice.read_text().replace("    authOptions:\n      mode: token\n", ""))
    kustomization = tmp_path / "k8s" / "base" / "kustomization.yaml"
    kustomization.write_text(kustomization.read_text().replace("  - networkpolicies.yaml\n", ""))
    report = validate_overlay(tmp_path / "k8s" / "overlays" / "cpu-dev", require_gpu=False,
                              canonical_serve=serve.load_canonical_serve_config())
    assert any("RayService/qrag: Ray token authentication is off" in p for p in report.problems), report.problems
    assert any("no default-deny ingress NetworkPolicy" in p for p in report.problems), report.problems
    assert not any("RayJob/qrag-index: Ray token authentication" in p for p in report.problems)


def test_cli_fails_a_single_manifest_without_the_lock_down(tmp_path, capsys, rendered):
    job = copy.deepcopy(_one(rendered["cpu-dev"], "RayJob"))
    security.cluster_spec(job).pop("authOptions")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    assert main([str(path)]) == 1
    err = capsys.readouterr().err
    assert "token authentication is off" in err and "no default-deny ingress NetworkPolicy" in err
    assert validate_docs(rendered["cpu-dev"], require_gpu=False).ok


# ---------------------------------------------------------------- the browser console (console.py)


def _serve_apps(doc: dict) -> list[dict]:
    return yaml.safe_load(doc["spec"]["serveConfigV2"])["applications"]


def test_the_console_is_off_in_the_base_and_every_shipped_overlay(rendered, canonical):
    """The Serve app's console arg defaults off, and nothing shipped turns it on."""
    from qrag_ray.serving.config import AppArgs

    assert AppArgs(tenants="/t.yaml").console is False
    assert all("console" not in app["args"] for app in canonical["applications"])
    for overlay, docs in rendered.items():
        assert all(not app["args"].get("console") for app in _serve_apps(_one(docs, "RayService"))), overlay


@pytest.mark.parametrize("overlay", sorted(OVERLAY_NAMES))
def test_the_console_component_opens_the_console_and_nothing_else(overlay, rendered, canonical):
    from tools.validate_deploy import console
    from tools.validate_deploy.render import render_with_components

    opened = render_with_components(OVERLAYS / overlay, [console.COMPONENT])
    assert [app["args"]["console"] for app in _serve_apps(_one(opened, "RayService"))] == [True]
    assert console.check_console_component(rendered[overlay], opened, canonical) == []
    report = validate_docs(opened, require_gpu=OVERLAY_NAMES[overlay]["gpu"],
                           canonical_serve=console.with_console(canonical), console_open=True)
    assert report.ok, report.problems
    # the same manifests without the component's explicit switch fail: the console is on
    closed = validate_docs(opened, require_gpu=OVERLAY_NAMES[overlay]["gpu"],
                           canonical_serve=console.with_console(canonical))
    assert any("args.console is True" in p and "k8s/components/console" in p for p in closed.problems), closed.problems
    # the NetworkPolicies are the overlay's own: the console rides the Serve port they already open
    assert [d for d in opened if d["kind"] == "NetworkPolicy"] == [d for d in rendered[overlay]
                                                                  if d["kind"] == "NetworkPolicy"]


def test_planted_console_in_the_base_fails(rendered, canonical):
    docs = copy.deepcopy(rendered["cpu-dev"])
    svc = _one(docs, "RayService")
    cfg = yaml.safe_load(svc["spec"]["serveConfigV2"])
    cfg["applications"][0]["args"]["console"] = True
    svc["spec"]["serveConfigV2"] = yaml.safe_dump(cfg)
    report = validate_docs(docs, require_gpu=False, canonical_serve=cfg)
    assert any("args.console is True" in p for p in report.problems), report.problems


def test_planted_component_that_opens_more_than_the_console_fails(tmp_path, canonical):
    """A component that also opens a port, or serves a stale config, is named by the validator."""
    from tools.validate_deploy import console
    from tools.validate_deploy.cli import Report, validate_console_component

    shutil.copytree(REPO / "k8s", tmp_path / "k8s")
    comp = tmp_path / "k8s" / "components" / "console"
    kz = yaml.safe_load((comp / "kustomization.yaml").read_text())
    opens_dashboard = "- op: add\n  path: /spec/ingress/0/ports/-\n  value: {protocol: TCP, port: 8265}\n"
    kz["patches"].append({"target": {"kind": "NetworkPolicy", "name": "qrag-serve-http"}, "patch": opens_dashboard})
    (comp / "kustomization.yaml").write_text(yaml.safe_dump(kz))
    report = validate_console_component(tmp_path, canonical, Report())
    assert any("changes more than serveConfigV2" in p for p in report.problems), report.problems
    assert any("opens ports [8000, 8265] to any address" in p for p in report.problems), report.problems
    stale = dict(canonical, http_options={**canonical["http_options"], "port": 9000})
    report = validate_console_component(REPO, stale, Report())
    assert any("--sync-serve-config" in p for p in report.problems), report.problems
    assert validate_console_component(REPO, canonical, Report()).ok
    assert console.console_serve_yaml("a: 1\nargs:\n  b: 2\n") == (
        "a: 1\nargs:\n  console: true  # the browser console at /console (k8s/components/console)\n  b: 2\n")


def test_sync_console_patch_regenerates_the_component_from_the_serve_config(tmp_path):
    from tools.validate_deploy import console

    patch = tmp_path / "patch.yaml"
    patch.write_text("# generated\n- op: replace\n  path: /spec/serveConfigV2\n  value: |\n    old: 1\n")
    serve_yaml = tmp_path / "serve.yaml"
    serve_yaml.write_text("# c\napplications:\n  - name: a\n    import_path: m:f\n    args:\n      shards: 2\n")
    assert console.sync_console_patch(patch, serve_yaml) is True
    ops = yaml.safe_load(patch.read_text())
    assert ops[0]["path"] == "/spec/serveConfigV2" and patch.read_text().startswith("# generated\n")
    assert yaml.safe_load(ops[0]["value"]) == {"applications": [{"name": "a", "import_path": "m:f",
                                                                  "args": {"console": True, "shards": 2}}]}
    assert console.sync_console_patch(patch, serve_yaml) is False
    from tools.validate_deploy.serve import SERVE_CONFIG, embed_serve_config

    shipped = console.PATCH.read_text()  # the shipped patch is what the sync writes, comments included
    assert embed_serve_config(shipped, console.console_serve_yaml(SERVE_CONFIG.read_text()), key="value") == shipped
