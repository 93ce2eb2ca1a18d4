"""torchrun, except that the TCPStore servers it hosts for a loopback address listen on loopback only.

    python -m backends.torch_ddp.torchrun [torchrun arguments]

torchrun's agent hosts two TCPStore servers (the c10d rendezvous store, and the store the workers
bootstrap from). TCPStore binds a server to every interface (0.0.0.0 or ::) whatever host it is
named by, and torchrun has no option to change that: only a socket handed over as
`master_listen_fd`, already bound, is used as it is. So for a store named by a loopback address
this launcher binds the socket to 127.0.0.1 itself and hands it over; a store named by any other
address (a multi-host run) is created exactly as torchrun would.
"""
from __future__ import annotations

import errno
import socket
import sys

import torch.distributed as dist
from torch.distributed import run
from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, dynamic_rendezvous

from common.launch import LOOPBACK, is_loopback

_TCPStore = dist.TCPStore


def loopback_tcp_store(host_name: str, port: int, *args, **kwargs):
    """TCPStore(...) with the same arguments; a server for a loopback host listens on 127.0.0.1 only."""
    is_master = kwargs.get("is_master", args[1] if len(args) > 1 else False)
    if is_master and kwargs.get("master_listen_fd") is None and is_loopback(host_name):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((LOOPBACK, port))
        except OSError as exc:
            sock.close()
            # The exception types torchrun's store set-up expects from a port it cannot take.
            # EADDRINUSE by name, as torchrun's own store says it: the backend retries on another port.
            reason = "EADDRINUSE" if exc.errno == errno.EADDRINUSE else str(exc)
            raise RuntimeError(f"cannot listen on {LOOPBACK}:{port}: {reason}") from exc
        port = sock.getsockname()[1]
        kwargs["master_listen_fd"] = sock.detach()  # TCPStore owns the descriptor from here
    return _TCPStore(host_name, port, *args, **kwargs)


def _bootstrap_store_server(self, master_addr: str, master_port: int):
    return loopback_tcp_store(master_addr, master_port, is_master=True, multi_tenant=True)


def main() -> None:
    # The two places torchrun's agent creates a server store: the c10d rendezvous backend (which
    # imports TCPStore by name) and the dynamic rendezvous handler's bootstrap store for the workers.
    c10d_rendezvous_backend.TCPStore = loopback_tcp_store
    dynamic_rendezvous.DynamicRendezvousHandler._create_tcp_store_server = _bootstrap_store_server
    run.main(sys.argv[1:])


if __name__ == "__main__":
    main()
