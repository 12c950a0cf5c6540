"""What every Ray pod needs to start and be scheduled: its caches on a writable mount (the root filesystem,
the home included, is read-only), `/dev/shm` at least the size of Ray's object store, and, for a GPU group,
scheduling by the GPU resource alone, the node selector being the user's patch (k8s/components/gpu-nodes-*).

Why: torch (its kernels dir, made by Ray Data LLM's model helper in the driver and every engine actor), vLLM,
Hugging Face and numba write under ~/.cache and ~/.config, which a read-only root filesystem refuses; Ray
puts its object store in /dev/shm, which a pod gets at 64 MiB unless a Memory emptyDir is mounted there, and
falls back to slow disk when it is smaller than the store; a node selector naming one accelerator (say
nvidia-l4) leaves the GPU pods Pending on every cluster of another kind.
"""

from __future__ import annotations

from pathlib import Path

from tools.validate_deploy.kuberay import GPU, containers, pod_templates, quantity

# env var -> what writes there; each must name a folder on a writable emptyDir of the container
CACHE_ENV = {
    "XDG_CACHE_HOME": "torch's kernels dir, vLLM's, Hugging Face's and numba's caches",
    "XDG_CONFIG_HOME": "vLLM's usage-stats file, matplotlib's config",
    "TRITON_CACHE_DIR": "Triton's compiled kernels",
}
OBJECT_STORE_SHARE = 0.3  # Ray's default object store: this share of the memory the container may use
SHM = "/dev/shm"
# node labels that pick one kind of accelerator: the user's choice, never the shipped overlays'
ACCELERATOR_LABELS = ("cloud.google.com/gke-accelerator", "nvidia.com/gpu.product",
                      "karpenter.k8s.aws/instance-gpu-name", "node.kubernetes.io/instance-type")
COMPONENTS = Path(__file__).resolve().parents[2] / "k8s" / "components"


def _volumes(template: dict) -> dict[str, dict]:
    return {v.get("name"): v for v in ((template.get("spec") or {}).get("volumes") or [])}


def _writable_dirs(template: dict, container: dict) -> list[str]:
    vols = _volumes(template)
    return [m["mountPath"].rstrip("/") for m in container.get("volumeMounts") or []
            if not m.get("readOnly") and "emptyDir" in vols.get(m.get("name"), {})]


def check_cache_env(doc: dict) -> list[str]:
    out = []
    for role, _, template in pod_templates(doc):
        for container in containers(template)[:1]:  # the Ray container
            env = {e.get("name"): e.get("value") for e in container.get("env") or [] if isinstance(e, dict)}
            dirs = _writable_dirs(template, container)
            for var, what in CACHE_ENV.items():
                val = str(env.get(var) or "")
                if not any(val == d or val.startswith(d + "/") for d in dirs):
                    out.append(f"{role} container {container.get('name')!r}: {var} ({what}) must name a folder on a "
                               f"writable emptyDir mount ({', '.join(dirs) or 'none'}), got {val or 'nothing'}: "
                               "the root filesystem is read-only")
    return out


def object_store_bytes(params: dict, container: dict) -> float:
    """Ray's object store on a node: rayStartParams object-store-memory, else its share of the memory limit."""
    if "object-store-memory" in params:
        return float(params["object-store-memory"])
    limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
    return OBJECT_STORE_SHARE * quantity(limit) if limit else 0.0


def check_shm(doc: dict) -> list[str]:
    out = []
    for role, params, template in pod_templates(doc):
        for container in containers(template)[:1]:
            vols = _volumes(template)
            mount = next((m for m in container.get("volumeMounts") or [] if m.get("mountPath") == SHM), None)
            src = (vols.get(mount["name"]) or {}).get("emptyDir") if mount else None
            need = object_store_bytes(params, container)
            if src is None or src.get("medium") != "Memory":
                out.append(f"{role} container {container.get('name')!r}: no Memory emptyDir at {SHM} (a pod's own is "
                           f"64 MiB; Ray's object store needs {need / 2**30:.1f} GiB)")
            elif "sizeLimit" in src and quantity(src["sizeLimit"]) < need:
                out.append(f"{role} container {container.get('name')!r}: {SHM} sizeLimit {src['sizeLimit']} is below "
                           f"Ray's object store ({need / 2**30:.1f} GiB): Ray would fall back to disk")
    return out


def gpu_templates(doc: dict) -> list[tuple[str, dict]]:
    """(group name, pod template) of the worker groups whose Ray container asks for a GPU."""
    spec = (doc.get("spec") or {})
    spec = spec.get("rayClusterConfig") or spec.get("rayClusterSpec") or {}
    return [(g.get("groupName"), g.get("template") or {}) for g in spec.get("workerGroupSpecs") or []
            if any(quantity(((c.get("resources") or {}).get("limits") or {}).get(GPU, 0)) >= 1
                   for c in containers(g.get("template")))]


def accelerator_pins(template: dict) -> list[str]:
    spec = template.get("spec") or {}
    pins = [k for k in spec.get("nodeSelector") or {} if k in ACCELERATOR_LABELS]
    terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    pins += [e.get("key") for t in terms for e in t.get("matchExpressions") or [] if e.get("key") in ACCELERATOR_LABELS]
    return pins


def check_gpu_scheduling(doc: dict, *, user_patch: bool = False) -> list[str]:
    """A GPU group is scheduled by its GPU request: the GPU in requests as in limits, the GPU taint tolerated,
    and (unless `user_patch`: a user's own node-selector component) no label naming one accelerator."""
    out = []
    for name, template in gpu_templates(doc):
        container = containers(template)[0]
        res = container.get("resources") or {}
        if quantity((res.get("requests") or {}).get(GPU, 0)) != quantity((res.get("limits") or {}).get(GPU, 0)):
            out.append(f"GPU group {name}: {GPU} requests must equal its limits")
        tol = (template.get("spec") or {}).get("tolerations") or []
        if not any(x.get("key") == GPU and x.get("operator") in ("Exists", None) for x in tol):
            out.append(f"GPU group {name}: no toleration of the {GPU} taint GPU nodes carry")
        if not user_patch and (pins := accelerator_pins(template)):
            out.append(f"GPU group {name}: pinned to one kind of accelerator by {', '.join(pins)}; the GPU request "
                       "schedules the pod, the node selector is the user's patch (k8s/components/gpu-nodes-*)")
    return out


def check_pods(doc: dict) -> list[str]:
    return check_cache_env(doc) + check_shm(doc) + check_gpu_scheduling(doc)


def check_node_selector_component(docs: list[dict], component: str) -> list[str]:
    """An overlay rendered with a k8s/components/gpu-nodes-* component: every GPU group of every Ray resource
    carries the component's node selector, and no CPU group does."""
    out = []
    for doc in docs:
        if doc.get("kind") not in ("RayJob", "RayService"):
            continue
        spec = doc["spec"].get("rayClusterConfig") or doc["spec"].get("rayClusterSpec") or {}
        gpu = {n for n, _ in gpu_templates(doc)}
        if not gpu:
            out.append(f"{doc['kind']}/{doc['metadata']['name']}: no GPU group for {component} to select nodes for")
        for group in spec.get("workerGroupSpecs") or []:
            pins = accelerator_pins(group.get("template") or {})
            where = f"{doc['kind']}/{doc['metadata']['name']} group {group.get('groupName')}"
            if group.get("groupName") in gpu and not pins:
                out.append(f"{where}: {component} sets no accelerator node selector")
            if group.get("groupName") not in gpu and pins:
                out.append(f"{where}: {component} pins a CPU group to GPU nodes ({', '.join(pins)})")
    return out
