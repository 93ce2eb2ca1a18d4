"""Issue #8 [A], security: nothing the suite reads back is unpickled, except tensors by
torch.load(weights_only=True); records are JSON."""
from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

from common.results import load_records, write_json_atomic
from tests.conftest import REPO

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
