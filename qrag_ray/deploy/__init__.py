"""Deployment helpers that need no cluster: offline validation of the KubeRay manifests, the Serve
config embedded in them, the Grafana dashboard and the Ray cluster-launcher config (validate.py)."""
