"""The lock-down of the Kubernetes manifests: Ray token authentication on every Ray cluster, the
`restricted` Pod Security Standard on the namespace, a securityContext on every pod and container
(KubeRay's autoscaler sidecar and the RayJob submitter included), NetworkPolicies that cover every pod
and open nothing but the Serve port to the world, and tenant keys from a Secret.

Why each rule: an unauthenticated Ray dashboard or GCS runs any code it is sent on every node; a pod no
NetworkPolicy selects takes connections from every pod of the cluster; a container that may run as
root, escalate privileges or write its root filesystem turns one bug into a node compromise; a tenants
file in a ConfigMap or the image is readable by whoever can read those.
"""

from __future__ import annotations

from typing import Any, Iterable

from tools.validate_deploy.kuberay import RAY_API, pod_templates

TOKEN_AUTH_MIN_RAY = (2, 52)  # the first Ray with token authentication (KubeRay's authOptions needs it)
SERVE_PORT = 8000
METRICS_PORT = 8080
DASHBOARD_PORT = 8265
COMPONENT = "app.kubernetes.io/component"
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def cluster_spec(doc: dict) -> dict:
    spec = doc.get("spec") or {}
    return spec.get("rayClusterConfig") or spec.get("rayClusterSpec") or {}


# ---------------------------------------------------------------- token authentication


def _version(version: Any) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in str(version).split(".")[:2])
    except ValueError:
        return ()


def check_token_auth(doc: dict) -> list[str]:
    """KubeRay's authOptions in token mode (it makes the token Secret and sets RAY_AUTH_MODE and
    RAY_AUTH_TOKEN in every Ray container), on a Ray that has token auth, and no container that
    overrides the mode."""
    out = []
    spec = cluster_spec(doc)
    mode = (spec.get("authOptions") or {}).get("mode")
    if mode != "token":
        out.append(f"Ray token authentication is off: the cluster spec needs authOptions: {{mode: token}} (got "
                   f"{mode!r})")
    if _version(spec.get("rayVersion")) < TOKEN_AUTH_MIN_RAY:
        out.append(f"rayVersion {spec.get('rayVersion')!r} has no token authentication (needs >= "
                   f"{'.'.join(map(str, TOKEN_AUTH_MIN_RAY))})")
    for role, _, template in pod_templates(doc):
        for container in _all_containers(template):
            for variable in container.get("env") or []:
                if variable.get("name") == "RAY_AUTH_MODE" and variable.get("value") != "token":
                    out.append(f"{role} container {container.get('name')!r} sets "
                               f"RAY_AUTH_MODE={variable.get('value')!r}, which overrides authOptions")
    return out


# ---------------------------------------------------------------- pod security


def _all_containers(template: dict) -> list[dict]:
    spec = (template or {}).get("spec") or {}
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


def _writable_mounts(template: dict, container: dict) -> list[str]:
    vols = {v.get("name"): v for v in ((template.get("spec") or {}).get("volumes") or [])}
    return [m["mountPath"] for m in container.get("volumeMounts") or []
            if not m.get("readOnly") and "emptyDir" in vols.get(m.get("name"), {})]


def check_container_security(context: dict | None, pod_context: dict | None, where: str) -> list[str]:
    """One container's securityContext (with its pod's): what `restricted` requires, plus a read-only
    root filesystem."""
    context = context or {}
    pod_context = pod_context or {}
    out = []
    non_root = context.get("runAsNonRoot", pod_context.get("runAsNonRoot"))
    uid = context.get("runAsUser", pod_context.get("runAsUser"))
    if non_root is not True:
        out.append(f"{where}: may run as root (runAsNonRoot: true missing)")
    if uid == 0:
        out.append(f"{where}: runAsUser 0 is root")
    if context.get("privileged"):
        out.append(f"{where}: privileged")
    if context.get("allowPrivilegeEscalation") is not False:
        out.append(f"{where}: allowPrivilegeEscalation must be false")
    caps = context.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or []):
        out.append(f"{where}: capabilities must drop ALL")
    if caps.get("add"):
        out.append(f"{where}: adds capabilities {caps['add']}")
    if context.get("readOnlyRootFilesystem") is not True:
        out.append(f"{where}: readOnlyRootFilesystem must be true (writable paths as explicit mounts)")
    seccomp = (context.get("seccompProfile") or pod_context.get("seccompProfile") or {}).get("type")
    if seccomp not in ("RuntimeDefault", "Localhost"):
        out.append(f"{where}: seccompProfile must be RuntimeDefault (got {seccomp!r})")
    return out


def check_pod_template(template: dict, where: str, *, ray: bool) -> list[str]:
    """A pod template: host namespaces, volume types, every container's securityContext, and for a Ray
    container a writable /tmp (Ray's session dir) since its root filesystem is read-only."""
    spec = (template or {}).get("spec") or {}
    out = []
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            out.append(f"{where}: {flag} is on")
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"{where}: volume {volume.get('name')!r} of type {sorted(kinds - RESTRICTED_VOLUMES)} is not "
                       "allowed")
    containers = _all_containers(template)
    if not containers:
        out.append(f"{where}: no containers")
    for container in containers:
        container_where = f"{where} container {container.get('name')!r}"
        out += check_container_security(container.get("securityContext"), spec.get("securityContext"), container_where)
        if ray and "/tmp" not in _writable_mounts(template, container):
            out.append(f"{container_where}: no writable emptyDir at /tmp (Ray's session dir on a read-only root "
                       "filesystem)")
    return out


def check_pod_security(doc: dict) -> list[str]:
    """Every pod KubeRay creates for a RayJob/RayService: Ray head and workers, the autoscaler sidecar
    (autoscalerOptions.securityContext) and, for a RayJob in K8sJobMode, the submitter pod."""
    out = []
    for i, (role, _, template) in enumerate(pod_templates(doc)):
        out += check_pod_template(template, f"{role} pod" if role == "head" else f"worker group {i}", ray=True)
    spec = cluster_spec(doc)
    if spec.get("enableInTreeAutoscaling"):
        pod_sc = ((spec.get("headGroupSpec") or {}).get("template") or {}).get("spec", {}).get("securityContext")
        out += check_container_security((spec.get("autoscalerOptions") or {}).get("securityContext"), pod_sc,
                                        "autoscaler sidecar (autoscalerOptions.securityContext)")
    if doc.get("kind") == "RayJob" and (doc.get("spec") or {}).get("submissionMode", "K8sJobMode") == "K8sJobMode":
        sub = (doc.get("spec") or {}).get("submitterPodTemplate")
        if not sub:
            out.append("no submitterPodTemplate: KubeRay's default submitter pod has no securityContext")
        else:
            out += check_pod_template(sub, "submitter pod", ray=False)
    return out


def check_namespace(docs: list[dict]) -> list[str]:
    namespaces = [d for d in docs if d.get("kind") == "Namespace"]
    if not namespaces:
        return ["no Namespace in the manifests (its Pod Security label is part of the lock-down)"]
    out = []
    for doc in namespaces:
        labels = (doc.get("metadata") or {}).get("labels") or {}
        if labels.get("pod-security.kubernetes.io/enforce") != "restricted":
            out.append(f"Namespace {doc['metadata']['name']}: pod-security.kubernetes.io/enforce must be restricted")
    return out


# ---------------------------------------------------------------- network policies


def selector_matches(selector: dict | None, labels: dict[str, str]) -> bool:
    """Kubernetes label selector semantics (matchLabels and matchExpressions; {} selects everything)."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key = expression.get("key")
        operator = expression.get("operator")
        vals = expression.get("values") or []
        if operator == "In" and labels.get(key) not in vals:
            return False
        if operator == "NotIn" and labels.get(key) in vals:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def ray_pods(docs: list[dict]) -> list[tuple[str, dict[str, str], bool]]:
    """(where, labels, is_head) of every pod the Ray resources create; KubeRay adds ray.io/node-type."""
    out = []
    for doc in docs:
        if doc.get("kind") not in ("RayJob", "RayService") or doc.get("apiVersion") != RAY_API:
            continue
        for i, (role, _, template) in enumerate(pod_templates(doc)):
            labels = dict(((template or {}).get("metadata") or {}).get("labels") or {}) | {"ray.io/node-type": role}
            group = "" if role == "head" else f" (group {i})"
            out.append((f"{doc['kind']} {doc['metadata']['name']} {role} pod{group}", labels, role == "head"))
    return out


def submitter_pods(docs: list[dict]) -> list[tuple[str, dict[str, str]]]:
    out = []
    for doc in docs:
        if doc.get("kind") == "RayJob":
            template = (doc.get("spec") or {}).get("submitterPodTemplate") or {}
            labels = (template.get("metadata") or {}).get("labels") or {}
            out.append((f"RayJob {doc['metadata']['name']} submitter pod", dict(labels)))
    return out


def _ports(rule: dict) -> set[int] | None:
    """The ports a rule opens; None = every port."""
    ports = rule.get("ports")
    if not ports:
        return None
    return {p.get("port") for p in ports}


def _ingress_policies(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d.get("kind") == "NetworkPolicy"
            and "Ingress" in ((d.get("spec") or {}).get("policyTypes") or ["Ingress"])]


def check_network_policies(docs: list[dict]) -> list[str]:
    """Default deny; every Ray pod and submitter selected by a policy; from outside a Ray cluster's own
    pods only the Serve port (to anyone), the metrics port (from another namespace, the monitoring one)
    and the dashboard (to a head, from another namespace or the RayJob's submitter)."""
    out = []
    policies = _ingress_policies(docs)
    if not any(((p.get("spec") or {}).get("podSelector") or {}) == {} and not (p.get("spec") or {}).get("ingress")
               for p in policies):
        out.append("no default-deny ingress NetworkPolicy (podSelector: {}, policyTypes: [Ingress], no rules)")
    pods = ray_pods(docs)
    submitters = submitter_pods(docs)
    for where, labels in [(w, lab) for w, lab, _ in pods] + submitters:
        if not any(selector_matches((p.get("spec") or {}).get("podSelector"), labels) for p in policies):
            out.append(f"{where}: no NetworkPolicy selects it (labels {labels})")
    serve_reachable = False
    for policy in policies:
        name = policy["metadata"]["name"]
        sel = (policy.get("spec") or {}).get("podSelector")
        targets = [(w, lab, head) for w, lab, head in pods if selector_matches(sel, lab)]
        for rule in (policy.get("spec") or {}).get("ingress") or []:
            ports = _ports(rule)
            peers = rule.get("from") or [{}]  # no `from`: every source
            for peer in peers:
                for where, labels, head in targets:
                    problem = _peer_problem(peer, ports, labels, head, [lab for _, lab, _ in pods], submitters)
                    if problem:
                        out.append(f"NetworkPolicy {name}: {where}: {problem}")
                    if peer == {} and ports and SERVE_PORT in ports:
                        serve_reachable = True
    if any(lab.get(COMPONENT) for _, lab, _ in pods) and not serve_reachable:
        out.append(f"no NetworkPolicy lets clients reach the Serve port {SERVE_PORT}")
    return out


def _peer_problem(peer: dict, ports: set[int] | None, labels: dict, head: bool, all_pods: Iterable[dict],
                  submitters: list[tuple[str, dict]]) -> str | None:
    shown = "every port" if ports is None else f"ports {sorted(ports)}"
    if "ipBlock" in peer or peer == {}:
        if ports is None or not ports <= {SERVE_PORT}:
            return f"opens {shown} to any address (only the Serve port {SERVE_PORT} may be)"
        return None
    if "namespaceSelector" in peer:
        allowed = {METRICS_PORT} | ({DASHBOARD_PORT} if head else set())
        if ports is None or not ports <= allowed:
            return (f"opens {shown} to another namespace (only metrics {METRICS_PORT}, and the dashboard "
                    f"{DASHBOARD_PORT} of a head, may be)")
        return None
    # a podSelector of this namespace: the pods of the same Ray cluster, or the RayJob's submitter
    sources = [lab for lab in all_pods if selector_matches(peer.get("podSelector"), lab)]
    sources += [lab for _, lab in submitters if selector_matches(peer.get("podSelector"), lab)]
    own = labels.get(COMPONENT)
    foreign = [s for s in sources if s.get(COMPONENT) != own or not own]
    if not foreign:
        return None
    if head and ports is not None and ports <= {DASHBOARD_PORT} and all(
            any(s == lab for _, lab in submitters) for s in foreign):
        return None
    return f"opens {shown} to pods outside its Ray cluster ({sorted({s.get(COMPONENT, '?') for s in foreign})})"


# ---------------------------------------------------------------- tenant keys


def check_tenants_secret(doc: dict, tenants_path: str | None) -> list[str]:
    """The tenants file (key hashes) of the Serve app comes from a Secret mounted in every pod of the
    RayService, never from a ConfigMap, the shared data volume or the image."""
    if not tenants_path:
        return []
    out = []
    for i, (role, _, template) in enumerate(pod_templates(doc)):
        spec = (template or {}).get("spec") or {}
        vols = {v.get("name"): v for v in spec.get("volumes") or []}
        for container in spec.get("containers") or []:
            src = None
            for mount in container.get("volumeMounts") or []:
                mount_path = mount["mountPath"].rstrip("/")
                if tenants_path == mount_path or tenants_path.startswith(mount_path + "/"):
                    src = vols.get(mount.get("name"), {})
            where = f"{role} pod" if role == "head" else f"worker group {i}"
            if src is None:
                out.append(f"{where}: the tenants file {tenants_path} is on no mounted volume (it would come from the "
                           "image)")
            elif "secret" not in src:
                kind = next(iter(set(src) - {"name"}), "?")
                out.append(f"{where}: the tenants file {tenants_path} comes from a {kind} volume, not a Secret")
    return out


def serve_tenants_paths(doc: dict) -> list[str]:
    """args.tenants of every app in a RayService's serveConfigV2 (a broken config is reported elsewhere)."""
    import yaml

    try:
        cfg = yaml.safe_load((doc.get("spec") or {}).get("serveConfigV2") or "") or {}
    except yaml.YAMLError:
        return []
    apps = cfg.get("applications") if isinstance(cfg, dict) else None
    return [a["args"]["tenants"] for a in apps or [] if isinstance(a, dict) and (a.get("args") or {}).get("tenants")]


def check_ray_resource(doc: dict) -> list[str]:
    """Everything above that concerns one RayJob or RayService."""
    out = check_token_auth(doc) + check_pod_security(doc)
    if doc.get("kind") == "RayService":
        for path in serve_tenants_paths(doc):
            out += check_tenants_secret(doc, path)
    return out


def check_manifests(docs: list[dict]) -> list[str]:
    """Everything above that concerns the manifests as a whole."""
    return check_namespace(docs) + check_network_policies(docs)
