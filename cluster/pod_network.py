"""Pods' own network on one machine: each pod of a rehearsal in a network namespace of its own, with its own
address on a bridge, as a Kubernetes pod has its own IP and its own ports. Two pods then both listen on
Serve's port 8000, and what one pod reaches on another goes over an address, as it does between pods.

The bridge (with the first address of a /24 in 10.0.0.0/8 that no route of this machine uses) is this
machine's side: a client here reaches every pod at its address, as a Service reaches its pods. Needs root
(network namespaces and links); `unavailable()` says why not in one line.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

SUBNETS = range(200, 250)  # 10.<n>.<tag>.0/24 tried in turn


@dataclass(frozen=True)
class PodNetwork:
    tag: str  # a few characters naming this rehearsal's links and namespaces
    subnet: str  # e.g. "10.231.7": the bridge is .1, pod i is .(10 + i)
    pods: int

    @property
    def bridge(self) -> str:
        return f"qrb{self.tag}"  # link names have at most 15 characters

    @property
    def gateway(self) -> str:
        return f"{self.subnet}.1"

    def ip(self, pod: int) -> str:
        return f"{self.subnet}.{10 + pod}"

    def netns(self, pod: int) -> str:
        return f"qrn{self.tag}-{pod}"

    def exec_prefix(self, pod: int) -> list[str]:
        """The argv prefix that runs a command in pod i's network."""
        return ["ip", "netns", "exec", self.netns(pod)]

    def setup_commands(self) -> list[list[str]]:
        """Pure: the `ip` commands that make the bridge and every pod's namespace, link and address."""
        cmds = [["ip", "link", "add", self.bridge, "type", "bridge"],
                ["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge],
                ["ip", "link", "set", self.bridge, "up"]]
        for pod in range(self.pods):
            namespace = self.netns(pod)
            host_end = f"qrv{self.tag}{pod}"
            cmds += [["ip", "netns", "add", namespace],
                     ["ip", "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", namespace],
                     ["ip", "link", "set", host_end, "master", self.bridge, "up"],
                     ["ip", "-n", namespace, "addr", "add", f"{self.ip(pod)}/24", "dev", "eth0"],
                     ["ip", "-n", namespace, "link", "set", "eth0", "up"],
                     ["ip", "-n", namespace, "link", "set", "lo", "up"],
                     ["ip", "-n", namespace, "route", "add", "default", "via", self.gateway]]
        return cmds

    def teardown_commands(self) -> list[list[str]]:
        """Pure: deleting a namespace deletes its link's both ends; then the bridge."""
        return [["ip", "netns", "del", self.netns(i)] for i in range(self.pods)] + [["ip", "link", "del", self.bridge]]


def used_networks() -> list[ipaddress.IPv4Network]:
    """This machine's IPv4 routes and addresses (but the default route), which a bridge must not shadow."""
    out = subprocess.run(["ip", "-4", "-o", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    nets = []
    for word in out.split():
        try:
            net = ipaddress.ip_network(word, strict=False)
        except ValueError:
            continue
        if isinstance(net, ipaddress.IPv4Network) and net.prefixlen > 0:
            nets.append(net)
    return nets


def plan(pods: int, tag: int | None = None) -> PodNetwork:
    """A network for `pods` pods on the first 10.n.<tag>.0/24 that overlaps none of this machine's."""
    tag = os.getpid() % 250 if tag is None else tag
    used = used_networks()
    for second_octet in SUBNETS:
        if not any(ipaddress.ip_network(f"10.{second_octet}.{tag}.0/24").overlaps(u) for u in used):
            return PodNetwork(f"{tag:03d}", f"10.{second_octet}.{tag}", pods)
    raise RuntimeError("no free 10.x.y.0/24 for the pods' bridge")


def unavailable() -> str | None:
    """Why pods cannot have networks of their own here (None: they can)."""
    if os.geteuid() != 0:
        return "pod networks need root (network namespaces)"
    if not shutil.which("ip"):
        return "pod networks need the `ip` command (iproute2)"
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"no network namespaces here: {probe.stderr.strip() or probe.returncode}"
    return None


def up(net: PodNetwork) -> None:
    """Make the network; on a failure nothing of it is left."""
    for cmd in net.setup_commands():
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            down(net)
            raise RuntimeError(f"`{' '.join(cmd)}` failed: {result.stderr.strip()}")


def down(net: PodNetwork, grace_s: float = 5.0) -> None:
    """End every process still in a pod's network (Ray's agents rewrite their command line and environment,
    so a cluster's own teardown can miss them; a namespace lives on while a process holds it), then remove
    whatever of the network exists (each command may find its part already gone)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = [p for i in range(net.pods) for p in netns_pids(net.netns(i))]
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = [p for i in range(net.pods) for p in netns_pids(net.netns(i))]
        if not left:
            break
    for cmd in net.teardown_commands():
        subprocess.run(cmd, capture_output=True)


def netns_pids(namespace: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if p.isdigit()]
