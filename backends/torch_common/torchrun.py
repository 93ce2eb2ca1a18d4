"""torchrun, except that the TCPStore servers it hosts for a loopback address listen on loopback only,
and that how it ended is written as JSON to $PARBENCH_LAUNCH_REPORT.

    python -m backends.torch_common.torchrun [torchrun arguments]

torchrun's agent hosts two TCPStore servers (the c10d rendezvous store, and the store the workers
bootstrap from). TCPStore binds a server to every interface (0.0.0.0 or ::) whatever host it is
named by, and torchrun has no option to change that: only a socket handed over as
`master_listen_fd`, already bound, is used as it is. So for a store named by a loopback address
this launcher binds the socket to 127.0.0.1 itself and hands it over; a store named by any other
address (a multi-host run) is created exactly as torchrun would.

The report is what torchrun's own objects say, not its log's prose: the ChildFailedError of a worker
group that failed (per rank: exit code, pid, time, and the message a worker decorated with torch's
`errors.record` wrote to its TORCHELASTIC_ERROR_FILE), a rendezvous that timed out, or a port taken.
"""
from __future__ import annotations

import errno
import inspect
import os
import signal
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed import run
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous import RendezvousTimeoutError, c10d_rendezvous_backend, dynamic_rendezvous

from backends.torch_common.launch import REPORT_ENV
from common.launch import LOOPBACK, is_loopback
from common.results import write_json_atomic

_TCPStore = dist.TCPStore


class PortTaken(RuntimeError):
    """The rendezvous port was bound by another process before this launcher could take it."""


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
            if exc.errno == errno.EADDRINUSE:  # the backend starts again on another port
                raise PortTaken(f"cannot listen on {LOOPBACK}:{port}: EADDRINUSE") from exc
            raise RuntimeError(f"cannot listen on {LOOPBACK}:{port}: {exc}") from exc
        port = sock.getsockname()[1]
        kwargs["master_listen_fd"] = sock.detach()  # TCPStore owns the descriptor from here
    return _TCPStore(host_name, port, *args, **kwargs)


def _bootstrap_store_server(self, master_addr: str, master_port: int):
    return loopback_tcp_store(master_addr, master_port, is_master=True, multi_tenant=True)


def failure_report(exc: BaseException) -> dict:
    """How a torchrun run ended badly, from the exception its agent raised."""
    if isinstance(exc, ChildFailedError):
        first = first_failed_rank(exc.failures)
        ranks = [{"rank": rank, "local_rank": f.local_rank, "pid": f.pid, "exitcode": f.exitcode,
                  "signal": f.signal_name() if f.exitcode < 0 else None, "timestamp": f.timestamp,
                  "message": _message(f.message)} for rank, f in sorted(exc.failures.items())]
        return {"kind": "workers_failed", "first_rank": first, "failures": ranks}
    taken = next((e for e in _chain(exc) if isinstance(e, PortTaken)), None)
    if taken is not None:  # torchrun wraps the store's error in its own
        return {"kind": "port_taken", "message": str(taken)}
    if isinstance(exc, RendezvousTimeoutError):
        return {"kind": "rendezvous_timeout", "message": str(exc)}
    return {"kind": "launcher_error", "message": f"{type(exc).__name__}: {exc}"}


def first_failed_rank(failures: dict) -> int:
    """The rank that failed first. torchrun's get_first_failure takes the earliest timestamp, but (torch 2.13) the
    ranks its agent stopped with SIGTERM after the failure are in the same table, and their stamps can come first: a
    rank whose collective broke when its peer died writes its error file then, while a peer that died without one
    (a signal, os._exit) is stamped when the agent sees it, a second or more later on a loaded machine. The agent
    stops ranks only after one failed, so a rank that did not die of SIGTERM goes first; among the others (every
    rank stopped, e.g. from outside), the earliest stamp."""
    return min(failures, key=lambda rank: (failures[rank].exitcode == -signal.SIGTERM, failures[rank].timestamp))


def _chain(exc: BaseException | None):
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


def _message(message) -> str:
    """An error file's message: a string, or {"message": ..., "extraInfo": {"py_callstack": ...}}."""
    return message.get("message", "") if isinstance(message, dict) else str(message)


# The two places torchrun's agent creates a server store, both torch internals: the c10d rendezvous backend
# (which imports TCPStore by name) and the dynamic rendezvous handler's bootstrap store for the workers.
STORE_SERVER_METHOD = ("self", "master_addr", "master_port")


def internals_missing(backend_module=c10d_rendezvous_backend,
                      handler=dynamic_rendezvous.DynamicRendezvousHandler) -> list[str]:
    """What of the internals the loopback binding replaces this torch no longer has (empty: all there)."""
    missing = []
    if getattr(backend_module, "TCPStore", None) is not dist.TCPStore:
        missing.append(f"{backend_module.__name__}.TCPStore")
    method = getattr(handler, "_create_tcp_store_server", None)
    if method is None or tuple(inspect.signature(method).parameters) != STORE_SERVER_METHOD:
        missing.append(f"{handler.__name__}._create_tcp_store_server{STORE_SERVER_METHOD}")
    return missing


def bind_stores_to_loopback() -> list[str]:
    """Replace both, or neither where torch moved one (the run goes on as torchrun would run it, listening on every
    interface, and says so on its log: a warning, not a failed run). Returns what was missing."""
    missing = internals_missing()
    if missing:
        print(f"parbench torchrun: WARNING: torch {torch.__version__} lacks {', '.join(missing)}; its stores listen on "
              "every interface, not loopback only", file=sys.stderr, flush=True)
        return missing
    c10d_rendezvous_backend.TCPStore = loopback_tcp_store
    dynamic_rendezvous.DynamicRendezvousHandler._create_tcp_store_server = _bootstrap_store_server
    return []


def main() -> None:
    bind_stores_to_loopback()
    try:
        run.main(sys.argv[1:])
    except Exception as exc:
        if os.environ.get(REPORT_ENV):
            write_json_atomic(Path(os.environ[REPORT_ENV]), failure_report(exc))
        raise


if __name__ == "__main__":
    main()
