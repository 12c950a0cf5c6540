"""Rehearse the KubeRay indexing job on this machine, the way the cluster runs it.

    python -m cluster.rehearse --overlay cpu-dev
    python -m cluster.rehearse --overlay gpu-prod --pods cpu-workers=1,gpu-workers=2 --env QRAG_KERNELS=cpu \\
        --set faiss.factory=Flat --set generator.questions=3 --set generator.concurrency=2

The overlay is rendered with kustomize and its RayJob becomes a local Ray cluster (cluster/local_cluster.py):
one node per pod, each declaring its pod's resources (CPUs and memory from the Ray container's limits,
`num-cpus` of rayStartParams first, GPUs as logical resources), with its container's environment, its home
read-only as the image's root filesystem is and only its mounted volumes writable. The pod paths (/mnt/qrag,
/etc/qrag, /tmp, /home/ray) are folders under --work. A tiny corpus is written where the entrypoint reads
(in its --format), the ConfigMap files where the head mounts them, and the job is submitted as KubeRay's
submitter does: `ray job submit --runtime-env-json <runtimeEnvYAML> --submission-id ... -- <entrypoint>`,
with a token of its own (RAY_AUTH_TOKEN on every node and the submitter). When the job succeeds the same
build runs again with plain `qrag index` (no cluster; the question cache it shares answers every prompt) and
the two indexes must be the same: every file's bytes equal but the FAISS files', whose vectors must agree
within a float tolerance (cluster/index_compare.py says why). Exit 0 only then. docs/CLUSTER.md, "Rehearsing the
indexing job".
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from cluster import local_cluster
from cluster.index_compare import differences
from cluster.pod_layout import POD_HOME, JobPlan, Pod, job_plan, local_paths, map_env, map_text
from cluster.pod_network import PodNetwork
from cluster.readonly import make_readonly

REPO = Path(__file__).resolve().parents[1]
# short topics of the Python language reference (pydoc_data ships with Python): a chunk each
TOPICS = ("break", "continue", "pass", "del", "return", "global")


@dataclass
class Rehearsal:
    overlay: str
    plan: JobPlan
    work: Path
    token: str
    shapes: list[local_cluster.NodeShape]
    entrypoint: str  # with the head's local paths
    params: dict  # the entrypoint's `qrag index` parameters, local paths
    runtime_env: dict
    code: str | None = None  # the checkout every node imports (PYTHONPATH), None: this environment's
    name: str = field(default_factory=lambda: f"rh{os.getpid() % 100000}")
    job_id: str = field(default_factory=lambda: f"qrag-index-{secrets.token_hex(4)}")
    state: local_cluster.ClusterState | None = None

    @property
    def cdir(self) -> Path:
        return local_cluster.default_dir(self.name)

    @property
    def readonly(self) -> list[str]:
        return readonly_folders(self.shapes)


def parse_pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        for part in filter(None, item.split(",") if what == "pods" else [item]):
            key, sep, val = part.partition("=")
            if not sep or not key:
                raise SystemExit(f"error: --{what} takes KEY=VALUE, got {part!r}")
            out[key.strip()] = val.strip()
    return out


def apply_settings(text: str, settings: dict[str, str]) -> str:
    """The index config YAML with dotted KEY=VALUE settings applied (values parsed as YAML)."""
    if not settings:
        return text
    data = yaml.safe_load(text) or {}
    for key, raw in settings.items():
        *parents, last = key.split(".")
        target = data
        for part in parents:
            target = target.setdefault(part, {})
        target[last] = yaml.safe_load(raw)
    return yaml.safe_dump(data, sort_keys=False)


def write_corpus(path: Path, fmt: str, docs: int) -> None:
    """A few short documents in the entrypoint's --format (jsonl records or MS MARCO's pid<TAB>passage)."""
    from pydoc_data.topics import topics

    from qrag_ray.io.pydoc_corpus import unwrap

    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [(t, " ".join(unwrap(topics[t]).split())[:600]) for t in TOPICS[:docs]]
    if fmt == "msmarco":
        path.write_text("".join(f"{i}\t{text}\n" for i, (_, text) in enumerate(rows)))
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps({"id": t, "title": f"The {t} statement", "text": text}) + "\n"
                                for t, text in rows))
    else:
        raise SystemExit(f"error: the rehearsal writes jsonl or msmarco corpora, the entrypoint reads {fmt}")


def models_cache() -> Path:
    """Where this machine's prepared models are (`qrag prepare-models`): the image bakes them in its home."""
    return Path(os.environ.get("QRAG_CACHE") or Path.home() / ".cache" / "qrag-ray").expanduser() / "models"


def lay_out_pod(pod: Pod, work: Path) -> tuple[dict[str, Path], list[str]]:
    """Make one pod's folders: its volumes, and a home holding the baked models (a link to this machine's)
    with a link for each volume mounted under it. Returns (pod path -> local path, read-only folders)."""
    paths = local_paths(pod, work)
    home = paths[POD_HOME]
    for pod_path, local in paths.items():
        if pod_path != POD_HOME:
            local.mkdir(parents=True, exist_ok=True)
            if pod_path.startswith(POD_HOME + "/"):
                link = home / pod_path[len(POD_HOME) + 1:]
                link.parent.mkdir(parents=True, exist_ok=True)
                if not link.is_symlink():
                    link.symlink_to(local, target_is_directory=True)
    baked = home / ".cache" / "qrag-ray" / "models"
    baked.parent.mkdir(parents=True, exist_ok=True)
    if models_cache().is_dir() and not baked.is_symlink():
        baked.symlink_to(models_cache(), target_is_directory=True)
    # what the pod cannot write: its home (the read-only root filesystem) and every read-only mount
    return paths, [str(home), *(str(paths[m.path.rstrip("/")]) for m in pod.mounts
                                if m.read_only and m.path.rstrip("/") in paths)]


def node_env(pod: Pod, paths: dict[str, Path], token: str, code: str | None) -> dict[str, str]:
    """A pod's Ray container environment as KubeRay gives it (the token of the cluster, the manifest's env),
    its paths local, the home the pod's."""
    env = {"HOME": str(paths[POD_HOME]), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", **map_env(pod.env, paths)}
    if code:
        env["PYTHONPATH"] = code
    return env


def pod_shapes(pods: tuple[Pod, ...], work: Path, token: str, code: str | None,
               net: PodNetwork | None = None) -> tuple[list[local_cluster.NodeShape], dict[str, Path]]:
    """Every pod's folders laid out under `work` and the node it runs as (its resources, environment and
    read-only folders; in a network of pods, its own address and namespace); and the head's pod path -> local
    folder."""
    shapes = []
    laid_out = [lay_out_pod(pod, work) for pod in pods]
    for number, (pod, (paths, readonly)) in enumerate(zip(pods, laid_out, strict=True)):
        shapes.append(local_cluster.NodeShape(pod.name, pod.num_cpus, pod.num_gpus, pod.memory or None,
                                              env=node_env(pod, paths, token, code), readonly=readonly,
                                   **({"ip": net.ip(number), "netns": net.exec_prefix(number)} if net else {})))
    return shapes, laid_out[0][0]


def readonly_folders(shapes: list[local_cluster.NodeShape]) -> list[str]:
    return sorted({f for s in shapes for f in s.readonly})


def default_token() -> str:
    """This machine's Ray token, by Ray's own lookup (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token),
    made first when there is none (for a cluster other drivers on this machine join too)."""
    env = local_cluster._env(Path("/nonexistent"))
    local_cluster.ensure_token(env)
    if env.get("RAY_AUTH_TOKEN"):
        return env["RAY_AUTH_TOKEN"]
    return Path(env.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token").expanduser().read_text().strip()


def prepare(overlay: str, work: Path, *, pods: dict[str, int] | None = None, env: dict[str, str] | None = None,
            settings: dict[str, str] | None = None, docs: int = 3, code: str | None = None,
            token: str | None = None) -> Rehearsal:
    """Render the overlay and lay out its pods, files and corpus under `work` (no process started)."""
    from tools.validate_deploy.kuberay import parse_entrypoint
    from tools.validate_deploy.render import render_kustomization

    path = Path(overlay) if Path(overlay).is_dir() else REPO / "k8s" / "overlays" / overlay
    plan = job_plan(render_kustomization(path), pods)
    token = token or secrets.token_hex(32)
    shapes, head_paths = pod_shapes(plan.pods, work, token, code)
    for pod_path, text in plan.files.items():
        local = Path(map_text(pod_path, head_paths))
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(map_text(apply_settings(text, settings or {}) if pod_path.endswith(".yaml") else text,
                                  head_paths))
    entrypoint = map_text(plan.entrypoint, head_paths)
    sub, params = parse_entrypoint(entrypoint)
    if sub != "index":
        raise SystemExit(f"error: the RayJob runs `qrag {sub}`, the rehearsal rehearses `qrag index`")
    write_corpus(Path(params["input"]), params.get("format") or "jsonl", docs)
    runtime_env = json.loads(map_text(json.dumps(plan.runtime_env), head_paths))
    if env:
        runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), **env}
    return Rehearsal(path.name, plan, work, token, shapes, entrypoint, params, runtime_env, code)


def start(rehearsal: Rehearsal, timeout: float = 240.0, quiet: bool = True) -> local_cluster.ClusterState:
    make_readonly(rehearsal.readonly)
    rehearsal.state = local_cluster.up(name=rehearsal.name, cdir=rehearsal.cdir, shapes=rehearsal.shapes,
                                       object_store_mb=300, timeout=timeout, quiet=quiet,
                            env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": rehearsal.token})
    return rehearsal.state


def stop(rehearsal: Rehearsal) -> bool:
    stopped = local_cluster.down(name=rehearsal.name, cdir=rehearsal.cdir, quiet=True)
    make_readonly(rehearsal.readonly, writable=True)
    return stopped


def submit_command(rehearsal: Rehearsal) -> list[str]:
    """KubeRay's submitter command (K8sJobMode) for this cluster."""
    return [local_cluster._ray_bin(), "job", "submit", "--address", rehearsal.state.dashboard_url,
            "--runtime-env-json", json.dumps(rehearsal.runtime_env), "--submission-id", rehearsal.job_id, "--",
            # the submitter's shell splits the entrypoint into words; one word would be run as one program name
            *shlex.split(rehearsal.entrypoint)]


def _driver_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH")}
    return env | extra


def submit(rehearsal: Rehearsal, timeout: float = 1800.0) -> tuple[int, str]:
    """Run the job to its end; (exit code of `ray job submit`, its output: the job's log)."""
    log = rehearsal.work / "job.log"
    with log.open("w") as log_file:
        try:
            returncode = subprocess.run(submit_command(rehearsal),
                                        env=_driver_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=rehearsal.token),
                                        stdout=log_file, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            returncode = 124
    return returncode, log.read_text(errors="replace")


def plain_build(rehearsal: Rehearsal, timeout: float = 1800.0) -> tuple[int, str, Path]:
    """The same build with plain `qrag index` in this process's environment (plus the job's env vars): no
    cluster, its own output beside the job's. Its in-process Ray declares the pods' GPUs (Ray's
    RAY_OVERRIDE_RESOURCES, logical ones on a CPU machine), so the config's GPU requests hold there too."""
    argv = shlex.split(rehearsal.entrypoint)[1:]
    if "--address" in argv:
        position = argv.index("--address")
        del argv[position:position + 2]
    out = rehearsal.work / "plain" / Path(rehearsal.params["output"]).name
    argv[argv.index("--output") + 1] = str(out)
    env = _driver_env(**(rehearsal.runtime_env.get("env_vars") or {}),
                      **({"PYTHONPATH": rehearsal.code} if rehearsal.code else {}))
    if gpus := sum(s.num_gpus for s in rehearsal.shapes):
        env["RAY_OVERRIDE_RESOURCES"] = json.dumps({"GPU": gpus})
    process = subprocess.run([sys.executable, "-m", "qrag_ray.cli", *argv], env=env, capture_output=True, text=True,
                             timeout=timeout)
    return process.returncode, process.stdout + process.stderr, out


def content_hash(index_dir: Path) -> str | None:
    manifest = index_dir / "manifest.json"
    return json.loads(manifest.read_text()).get("content_hash") if manifest.is_file() else None


@dataclass
class Outcome:
    ok: bool
    job_rc: int
    job_log: str
    job_hash: str | None = None
    plain_hash: str | None = None
    plain_log: str = ""
    differences: list[str] = field(default_factory=list)  # job's index against the plain build's
    seconds: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        if self.job_rc != 0:
            return f"the job failed (ray job submit exit {self.job_rc}); its log ends:\n{self.job_log[-4000:]}"
        if self.job_hash is None:
            return "the job succeeded but published no index with a content_hash"
        if self.plain_hash is None:
            return f"plain `qrag index` failed:\n{self.plain_log[-4000:]}"
        if self.ok:
            if self.job_hash == self.plain_hash:
                same = "content_hash equal"
            else:
                same = "equal but for float-level vector differences"
            return f"the job's index and plain qrag index's: {same}"
        return "the job's index differs from plain qrag index's:\n  " + "\n  ".join(self.differences)


def run_job(rehearsal: Rehearsal, timeout: float = 1800.0, compare: bool = True) -> Outcome:
    """Submit the job to the started cluster; then, if it published, the plain build and the comparison."""
    started = time.monotonic()
    returncode, log = submit(rehearsal, timeout)
    out = Outcome(False, returncode, log, seconds={"job": round(time.monotonic() - started, 1)})
    if returncode != 0 or not compare:
        return out
    out.job_hash = content_hash(Path(rehearsal.params["output"]))
    if out.job_hash is None:
        return out
    plain_started = time.monotonic()
    prc, out.plain_log, plain = plain_build(rehearsal, timeout)
    out.seconds["plain"] = round(time.monotonic() - plain_started, 1)
    out.plain_hash = content_hash(plain) if prc == 0 else None
    if out.plain_hash is not None:
        out.differences = [] if out.plain_hash == out.job_hash else differences(Path(rehearsal.params["output"]), plain)
        out.ok = not out.differences
    return out


def describe(rehearsal: Rehearsal) -> str:
    rows = [f"  {s.name}: {s.num_cpus} CPUs, {s.num_gpus} GPUs, {(s.memory or 0) / 2**30:.0f} GiB"
            for s in rehearsal.shapes]
    return "\n".join([f"rehearsing the RayJob of overlay {rehearsal.overlay} in {rehearsal.work}", *rows,
                      "  $ " + shlex.join(["ray", "job", "submit", "--runtime-env-json",
                                           json.dumps(rehearsal.runtime_env),
                                           "--submission-id", rehearsal.job_id, "--", rehearsal.entrypoint])])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.rehearse", description=__doc__.split("\n\n")[0])
    parser.add_argument("--overlay", default="cpu-dev", help="k8s/overlays/<name> or a kustomization folder")
    parser.add_argument("--pods", action="append", default=[], metavar="GROUP=N,...",
                        help="pods per worker group (default: each group's replicas, at least 1)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="an env var added to the job's runtime env, as a user adds one to runtimeEnvYAML")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                        help="a setting of the ConfigMap's index config (dotted key, YAML value)")
    parser.add_argument("--docs", type=int, default=3, help=f"documents in the corpus (at most {len(TOPICS)})")
    parser.add_argument("--code", default=None,
                        help="the qrag-ray checkout every node imports (default: this environment's)")
    parser.add_argument("--work", default=None, help="folder for the pods' paths (default: a new temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (the job's log, both indexes)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds the job may take")
    args = parser.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="qrag-rehearse-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    pods = {k: int(v) for k, v in parse_pairs(args.pods, "pods").items()}
    rehearsal = prepare(args.overlay, work, pods=pods, env=parse_pairs(args.env, "env"),
                        settings=parse_pairs(args.settings, "set"),
                        docs=min(args.docs, len(TOPICS)), code=str(Path(args.code).resolve()) if args.code else None)
    print(describe(rehearsal), file=sys.stderr)
    os.environ["RAY_AUTH_TOKEN"] = rehearsal.token  # this process watches the nodes start: the cluster's token
    try:
        start(rehearsal, quiet=False)
        outcome = run_job(rehearsal, args.timeout)
    finally:
        stopped = stop(rehearsal)
    print(outcome.summary(), file=sys.stderr)
    print(json.dumps({"overlay": rehearsal.overlay, "ok": outcome.ok, "job_hash": outcome.job_hash,
                      "plain_hash": outcome.plain_hash, "seconds": outcome.seconds, "work": str(work)}))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if outcome.ok and stopped else 1


if __name__ == "__main__":
    sys.exit(main())
