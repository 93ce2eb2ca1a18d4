"""Several hosts: the node options, which address and interface a node uses, and a small rendezvous
for launchers that must know every node's address before they start (TF_CONFIG).

Rules every backend follows: `--devices` is the processes per node, the world is nnodes x devices;
node 0 hosts the rendezvous at --master-addr:--master-port and both sides must be given the same
pair (there is no default port with nnodes > 1); node 0's bench.run writes the run's record.
"""
from __future__ import annotations

import fcntl
import ipaddress
import json
import socket
import struct
import time

from common.errors import BadInput
from common.launch import LOOPBACK

_SIOCGIFADDR = 0x8915  # Linux ioctl: the IPv4 address of an interface


def check_node_options(nnodes: int, node_rank: int, master_addr: str | None, master_port: int | None) -> None:
    """Bad input (exit 2) for a node layout that cannot meet its peers."""
    if node_rank >= nnodes:
        raise BadInput(f"--node-rank {node_rank} is not below --nnodes {nnodes}")
    if nnodes == 1:
        if master_addr:
            raise BadInput("--master-addr is for --nnodes > 1: one node's rendezvous stays on loopback")
        return
    if not master_addr:
        raise BadInput(f"--nnodes {nnodes} needs --master-addr (node 0's address, the same on every node)")
    if not master_port:
        raise BadInput(f"--nnodes {nnodes} needs --master-port (the same on every node; no default, so that "
                       "two jobs never meet by accident)")
    try:
        address = ipaddress.ip_address(master_addr)
    except ValueError:
        raise BadInput(f"--master-addr {master_addr!r}: give node 0's IPv4 address") from None
    if address.version != 4 or address.is_unspecified or address.is_multicast:
        raise BadInput(f"--master-addr {master_addr}: not a unicast IPv4 address")
    if address.is_loopback:
        raise BadInput(f"--master-addr {master_addr}: a loopback address cannot reach other hosts")
    if node_rank == 0 and master_addr not in local_addresses():
        raise BadInput(f"--node-rank 0 hosts the rendezvous, but {master_addr} is not an address of this host "
                       f"(it has {', '.join(sorted(local_addresses()))})")


def local_addresses() -> set[str]:
    """The IPv4 addresses of this host's (or network namespace's) interfaces."""
    return {addr for _, addr in _interfaces()}


def _interfaces() -> list[tuple[str, str]]:
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface
                continue
            found.append((name, socket.inet_ntoa(raw[20:24])))
    return found


def address_towards(master_addr: str) -> str:
    """The local address the kernel routes to `master_addr` from: the one peers can reach us at."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((master_addr, 9))  # UDP connect sends nothing; it only picks the route
        return s.getsockname()[0]


def interface_of(address: str) -> str:
    """The interface that holds `address` (gloo and msrun bind by interface name)."""
    for name, addr in _interfaces():
        if addr == address:
            return name
    raise OSError(f"no interface holds {address}")


def exchange(master_addr: str, master_port: int, node_rank: int, nnodes: int, mine: dict,
             timeout_s: float) -> list[dict]:
    """Every node's `mine`, in node order, on every node. Node 0 listens on master_addr:master_port;
    the others connect (retrying until node 0 is up). Raises TimeoutError naming the missing nodes
    when the deadline passes, so a missing peer ends the run instead of hanging it."""
    deadline = time.monotonic() + timeout_s
    if node_rank == 0:
        return _serve(master_addr, master_port, nnodes, mine, deadline)
    return _join(master_addr, master_port, node_rank, mine, deadline)


def _serve(addr: str, port: int, nnodes: int, mine: dict, deadline: float) -> list[dict]:
    table: dict[int, dict] = {0: mine}
    peers: list[socket.socket] = []
    with socket.create_server((addr, port), backlog=nnodes) as server:
        try:
            while len(table) < nnodes:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = sorted(set(range(nnodes)) - set(table))
                    raise TimeoutError(f"node rendezvous on {addr}:{port}: node(s) {missing} did not join "
                                       f"within the collective timeout")
                server.settimeout(remaining)
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                conn.settimeout(max(1.0, deadline - time.monotonic()))
                try:
                    hello = _read_message(conn)
                except (OSError, ValueError):
                    conn.close()  # a stray or broken connection is not a node
                    continue
                table[int(hello["node_rank"])] = hello["payload"]
                peers.append(conn)
            everyone = [table[r] for r in range(nnodes)]
            for conn in peers:
                conn.sendall(json.dumps(everyone).encode() + b"\n")
            return everyone
        finally:
            for conn in peers:
                conn.close()


def _join(addr: str, port: int, node_rank: int, mine: dict, deadline: float) -> list[dict]:
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"node rendezvous: node 0 at {addr}:{port} did not answer within the "
                               "collective timeout")
        try:
            with socket.create_connection((addr, port), timeout=min(5.0, remaining)) as conn:
                conn.sendall(json.dumps({"node_rank": node_rank, "payload": mine}).encode() + b"\n")
                conn.settimeout(max(1.0, deadline - time.monotonic()))
                return _read_message(conn)
        except (ConnectionRefusedError, TimeoutError, OSError):
            time.sleep(0.5)


def _read_message(conn: socket.socket):
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            raise ValueError("connection closed mid-message")
        data += chunk
        if len(data) > 1 << 20:
            raise ValueError("message too large")
    return json.loads(data)


def describe_nodes(nnodes: int, node_rank: int, devices_per_node: int, master_addr: str | None,
                   master_port: int | None) -> dict:
    """The record's node fields before the run; `nodes.hosts` is filled from the ranks after it."""
    master = f"{master_addr}:{master_port}" if nnodes > 1 else None
    return {"nnodes": nnodes, "node_rank": node_rank, "devices_per_node": devices_per_node,
            "nodes": {"master": master, "hosts": []}}


def rank_host(nnodes: int, node_rank: int, master_addr: str) -> dict:
    """Where one rank runs, as its peers see it; gathered from every rank into the record."""
    address = address_towards(master_addr) if nnodes > 1 else LOOPBACK
    return {"node_rank": node_rank, "name": socket.gethostname(), "address": address}


def hosts_table(rank_hosts: list[dict]) -> list[dict]:
    """Per node: its name, address and the global ranks it ran, in node order."""
    nodes: dict[tuple, dict] = {}
    for rank, host in enumerate(rank_hosts):
        key = (host["node_rank"], host["name"], host["address"])
        nodes.setdefault(key, {**host, "ranks": []})["ranks"].append(rank)
    return [nodes[k] for k in sorted(nodes)]
