"""A private test network of Linux network namespaces: one per host, joined by a bridge.

Layout (``N`` is a per-run subnet number)::

    root namespace  gr<tag> 10.213.N.254 --+
    <prefix>-srv    eth0    10.213.N.10  --+-- br0 (in <prefix>-br)
    <prefix>-h1     eth0    10.213.N.1   --+
    <prefix>-h2     eth0    10.213.N.2   --+

Each host's link is a veth pair whose outer end sits in the bridge namespace, so a link can be
rate-limited (``tc tbf`` on the outer end shapes traffic *into* the host) or cut (outer end down)
without touching the host's side. The root namespace gets a leg on the bridge too, so the test
process (and the CLI it runs) reaches every host. ``close()`` removes everything it made.
"""

from __future__ import annotations

import os
import subprocess
import uuid


class NetLabUnavailable(RuntimeError):
    pass


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


class NetLab:
    def __init__(self, hosts: list[str]) -> None:
        if os.geteuid() != 0:
            raise NetLabUnavailable("network namespaces need root (ip netns add)")
        self.tag = uuid.uuid4().hex[:5]
        self.prefix = f"gs{self.tag}"
        self.net = f"10.213.{os.getpid() % 250 + 1}"
        self.bridge_ns = f"{self.prefix}-br"
        self.root_if = f"gr{self.tag}"
        self.hosts: dict[str, dict[str, str]] = {}
        self.made: list[str] = []
        try:
            self._ns(self.bridge_ns)
        except RuntimeError as e:
            self.close()
            raise NetLabUnavailable(f"cannot create a network namespace here: {e}") from None
        try:
            _ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.bridge_ns, "link", "set", "br0", "up")
            for i, name in enumerate(hosts, start=1):
                self._add_host(name, f"{self.net}.{10 if name == 'srv' else i}", i)
            _ip("link", "add", self.root_if, "type", "veth", "peer", "name", f"gq{self.tag}")
            _ip("link", "set", f"gq{self.tag}", "netns", self.bridge_ns)
            _ip("-n", self.bridge_ns, "link", "set", f"gq{self.tag}", "master", "br0", "up")
            _ip("addr", "add", f"{self.net}.254/24", "dev", self.root_if)
            _ip("link", "set", self.root_if, "up")
        except Exception:
            self.close()
            raise

    def _ns(self, name: str) -> None:
        _ip("netns", "add", name)
        self.made.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _add_host(self, name: str, address: str, i: int) -> None:
        ns, outer, inner = f"{self.prefix}-{name}", f"gb{self.tag}{i}", f"gh{self.tag}{i}"
        self._ns(ns)
        _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
        _ip("link", "set", inner, "netns", ns)
        _ip("link", "set", outer, "netns", self.bridge_ns)
        _ip("-n", ns, "link", "set", inner, "name", "eth0")
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", self.bridge_ns, "link", "set", outer, "master", "br0", "up")
        self.hosts[name] = {"ns": ns, "address": address, "outer": outer}

    # ------------------------------------------------------------ the test's levers
    def ns(self, host: str) -> str:
        return self.hosts[host]["ns"]

    def address(self, host: str) -> str:
        return self.hosts[host]["address"]

    def limit(self, host: str, mbit: float, from_port: int) -> None:
        """Shape to ``mbit`` Mbit/s the traffic into ``host`` sent from TCP port ``from_port`` (a data
        server's replies: staging), leaving everything else (the ranks' gloo traffic) at full speed.

        An ``htb`` root whose default class is not limited in practice (10 Gbit/s); a u32 filter on
        the source port sends the matching packets to a class capped at ``mbit``.
        """
        dev, tc = self.hosts[host]["outer"], ["ip", "netns", "exec", self.bridge_ns, "tc"]
        for args in (["qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "10"],
                     ["class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit"],
                     ["class", "add", "dev", dev, "parent", "1:", "classid", "1:20", "htb", "rate", f"{mbit}mbit",
                      "ceil", f"{mbit}mbit", "burst", "16kb"],
                     ["filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match",
                      "ip", "sport", str(from_port), "0xffff", "flowid", "1:20"]):
            out = subprocess.run([*tc, *args], capture_output=True, text=True)
            if out.returncode != 0:
                raise RuntimeError(f"tc {' '.join(args)}: {out.stderr.strip()}")

    def unlimit(self, host: str) -> None:
        subprocess.run(["ip", "netns", "exec", self.bridge_ns, "tc", "qdisc", "del", "dev",
                        self.hosts[host]["outer"], "root"], capture_output=True)

    def cut(self, host: str) -> None:
        """Pull the host's cable: its processes live on, but nothing reaches it or leaves it."""
        _ip("-n", self.bridge_ns, "link", "set", self.hosts[host]["outer"], "down")

    def close(self) -> None:
        subprocess.run(["ip", "link", "del", self.root_if], capture_output=True)
        for ns in reversed(self.made):  # deleting a namespace deletes the veth ends inside it
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.made.clear()

    def leftovers(self) -> list[str]:
        """Namespaces of this lab that still exist (for the test's clean-up check)."""
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        return [line.split()[0] for line in out.splitlines() if line.startswith(self.prefix)]
