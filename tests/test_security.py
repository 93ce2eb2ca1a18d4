"""Issue #8 [A], security: nothing the suite reads back is unpickled, except tensors by
torch.load(weights_only=True); records are JSON."""
from __future__ import annotations

import json
import os
import pickle
import re
import types
from pathlib import Path

import pytest

from common.results import load_records, write_json_atomic
from tests.conftest import REPO
from tests.faults import listening_sockets

SOURCES = [p for d in ("common", "backends", "bench") for p in (REPO / d).rglob("*.py")]
UNSAFE = re.compile(r"\bpickle\.loads?\(|\bdill\b|\bjoblib\b|\bshelve\b|allow_pickle\s*=\s*True|\bmarshal\.loads?\(")


def _calls(text: str, name: str) -> list[str]:
    """The full text of every call to `name(` in `text` (up to its closing parenthesis)."""
    calls = []
    for match in re.finditer(re.escape(name) + r"\(", text):
        depth, end = 0, match.end() - 1
        for end in range(match.end() - 1, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
        calls.append(text[match.start():end + 1])
    return calls


def test_the_sources_scanned_are_the_suite():
    assert len(SOURCES) > 30 and any(p.name == "trainer.py" for p in SOURCES)


def test_every_torch_load_is_weights_only():
    loads = {p: _calls(p.read_text(), "torch.load") for p in SOURCES}
    assert any(loads.values()), "the torch trainer loads checkpoints"
    bad = [f"{p.relative_to(REPO)}: {c}" for p, calls in loads.items() for c in calls if "weights_only=True" not in c]
    assert bad == []


def test_nothing_is_unpickled_by_other_means():
    bad = [f"{p.relative_to(REPO)}: {m[0]}" for p in SOURCES for m in UNSAFE.finditer(p.read_text())]
    assert bad == []


class _RunsCode:
    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        return (Path.touch, (self.target,))


def test_records_are_json_and_a_planted_pickle_is_ignored(tmp_path):
    write_json_atomic(tmp_path / "runs" / "a.json", {"run_id": "a", "status": "ok"})
    assert json.loads((tmp_path / "runs" / "a.json").read_text())["run_id"] == "a"
    (tmp_path / "runs" / "b.json").write_bytes(pickle.dumps(_RunsCode(tmp_path / "pwned")))
    assert [r["run_id"] for r in load_records(tmp_path)] == ["a"]
    assert not (tmp_path / "pwned").exists()


# torchrun binds its TCPStore servers to every interface; backends.torch_common.torchrun replaces two torch
# internals so that a single-host run listens on loopback only. These tests say when torch moves them.

def test_the_torch_internals_the_loopback_binding_replaces_are_there():
    from backends.torch_common import torchrun

    assert torchrun.internals_missing() == []


def test_a_moved_internal_is_named_and_nothing_is_replaced():
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, dynamic_rendezvous

    from backends.torch_common import torchrun

    class Renamed:  # a handler whose store method torch renamed
        def _create_store_server(self, master_addr, master_port):
            return None

    class Resigned:  # the same name, other parameters
        def _create_tcp_store_server(self, addr, port, timeout):
            return None

    module_without_store = types.ModuleType("c10d_rendezvous_backend")
    assert torchrun.internals_missing(handler=Renamed) == [
        "Renamed._create_tcp_store_server('self', 'master_addr', 'master_port')"]
    assert torchrun.internals_missing(handler=Resigned) != []
    assert torchrun.internals_missing(backend_module=module_without_store) == ["c10d_rendezvous_backend.TCPStore"]
    before = (c10d_rendezvous_backend.TCPStore, dynamic_rendezvous.DynamicRendezvousHandler._create_tcp_store_server)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torchrun, "internals_missing", lambda: ["x"])
        assert torchrun.bind_stores_to_loopback() == ["x"]
    after = (c10d_rendezvous_backend.TCPStore, dynamic_rendezvous.DynamicRendezvousHandler._create_tcp_store_server)
    assert after == before


def test_the_bootstrap_store_torchrun_creates_listens_on_loopback_only():
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, dynamic_rendezvous

    from backends.torch_common import torchrun

    handler = dynamic_rendezvous.DynamicRendezvousHandler
    with pytest.MonkeyPatch.context() as patch:  # undone after the test: the pytest process keeps torch's own
        patch.setattr(c10d_rendezvous_backend, "TCPStore", c10d_rendezvous_backend.TCPStore)
        patch.setattr(handler, "_create_tcp_store_server", handler._create_tcp_store_server)
        assert torchrun.bind_stores_to_loopback() == []
        store = handler._create_tcp_store_server(None, "127.0.0.1", 0)  # as torchrun's agent calls it
        try:
            listening = [a for a, port in listening_sockets([os.getpid()]) if port == store.port]
        finally:
            del store
    assert listening == ["127.0.0.1"]
