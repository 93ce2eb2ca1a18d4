"""The README tells a new user how to get an environment that runs its commands."""
from __future__ import annotations

import re

from backends import BACKENDS
from tests.conftest import REPO


def test_the_usage_section_installs_every_backends_extra():
    usage = (REPO / "README.md").read_text().split("## Usage", 1)[1].split("\n## ", 1)[0]
    assert "python3 -m venv .venv && . .venv/bin/activate" in usage
    installed = set(re.findall(r"pip install -e '\.\[(\w+)\]'", usage))
    assert installed == {entry.extra for entry in BACKENDS.values()} | {"dev"}
