"""Hosts for the multi-host tests: network namespaces made by the test, each joined by a
veth pair to a bridge it creates on a private subnet (the controller listens on the
bridge's address). Needs root and iproute2; everything is removed at the end."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess


def available() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class Network:
    def __init__(self, hosts: int) -> None:
        self.tag = secrets.token_hex(2)
        self.subnet = f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(250)}"
        self.bridge = f"aw{self.tag}b"
        self.gateway = f"{self.subnet}.1"
        self.namespaces = [f"aw{self.tag}r{n}" for n in range(1, hosts + 1)]
        ip("link", "add", self.bridge, "type", "bridge")
        # A bridge takes its lowest port's address unless given one: cutting that port
        # would change the gateway's address under every other host's ARP cache.
        mac = secrets.token_bytes(5)
        ip("link", "set", self.bridge, "address", "02:" + ":".join(f"{b:02x}" for b in mac))
        ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for n, namespace in enumerate(self.namespaces, 1):
            ip("netns", "add", namespace)
            ip("-n", namespace, "link", "set", "lo", "up")
            self.join(n)

    def join(self, n: int) -> None:
        """(Re)connect host N to the bridge."""
        host, peer, namespace = f"aw{self.tag}h{n}", f"aw{self.tag}p{n}", self.namespaces[n - 1]
        ip("link", "add", host, "type", "veth", "peer", "name", peer)
        ip("link", "set", peer, "netns", namespace)
        ip("link", "set", host, "master", self.bridge)
        ip("link", "set", host, "up")
        ip("-n", namespace, "addr", "add", f"{self.subnet}.{10 + n}/24", "dev", peer)
        ip("-n", namespace, "link", "set", peer, "up")

    def cut(self, n: int) -> None:
        """Remove host N's link (both ends of the pair go)."""
        ip("link", "del", f"aw{self.tag}h{n}")

    def prefix(self, n: int) -> list[str]:
        """The argv prefix that runs a command on host N."""
        return ["ip", "netns", "exec", self.namespaces[n - 1]]

    def close(self) -> None:
        for namespace in self.namespaces:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
