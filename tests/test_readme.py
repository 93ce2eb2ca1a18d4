"""README.md and docs/ tell a new user things that work: the install lines cover every backend, every command in a
bash block parses with the tool's own parser, every nox session named exists, and every relative link leads to a
file. A command that is only a sketch of a syntax belongs in a `text` block, where none of this applies."""
from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest

from backends import BACKENDS
from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BASH_BLOCK = re.compile(r"```bash\n(.*?)```", re.S)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _page_id(page: Path) -> str:
    return str(page.relative_to(REPO))


def shell_commands(text: str) -> list[str]:
    """The commands of a page's bash blocks: continuation lines joined, comments dropped."""
    out = []
    for block in BASH_BLOCK.findall(text):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def bench_invocations(command: str) -> list[tuple[str, list[str]]]:
    """(tool, argv) for every `python -m bench.TOOL ...` in a command line, also behind `srun ...` or `&&`."""
    found = []
    for part in re.split(r"&&|\|\||;", command):
        words = shlex.split(part)
        for i, word in enumerate(words[:-1]):
            if Path(word).name.startswith("python") and words[i + 1] == "-m" and i + 2 < len(words):
                module = words[i + 2]
                if module.startswith("bench."):
                    found.append((module.removeprefix("bench."), words[i + 3:]))
    return found


def parse_with_the_tool(tool: str, argv: list[str]) -> None:
    """Parse argv as the tool itself does before it runs anything; SystemExit(2) means bad input."""
    module = importlib.import_module(f"bench.{tool}")
    if tool == "slurm":  # its own options, the rest bench.compare's (bench.slurm.main does the same)
        _, rest = module.build_parser().parse_known_args(argv)
        module.compare_argv(rest)
        return
    module.build_parser().parse_args(argv)


def nox_sessions() -> set[str]:
    text = (REPO / "noxfile.py").read_text()
    sessions = {f"bench-{name}" for name in BACKENDS}
    for options, function in re.findall(r"@nox\.session\(([^)]*)\)\ndef (\w+)\(", text):
        named = re.search(r'name="([\w-]+)"', options)
        sessions.add(named.group(1) if named else function)
    return sessions


ALL_COMMANDS = [(page, cmd) for page in PAGES for cmd in shell_commands(page.read_text())]


def test_the_install_section_installs_every_backends_extra():
    usage = (REPO / "docs" / "usage.md").read_text().split("## Installing", 1)[1].split("\n## ", 1)[0]
    assert "python3 -m venv .venv && . .venv/bin/activate" in usage
    installed = set(re.findall(r"pip install -e '\.\[(\w+)\]'", usage))
    assert installed == {entry.extra for entry in BACKENDS.values()} | {"dev"}


def test_the_front_page_is_short_and_maps_every_docs_page():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    linked = {Path(target).name for target in LINK.findall(readme) if target.startswith("docs/")}
    pages = {p.name for p in (REPO / "docs").glob("*.md")}
    assert pages - linked == set(), "docs pages the README's map does not link"


def test_the_quick_start_has_the_two_commands_ci_runs():
    quick = (REPO / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = shell_commands(quick)
    assert len(commands) == 2
    assert commands[0].endswith("nox -s bench-torch_ddp")
    assert commands[1].endswith("nox -s tests")
    assert "nox -s lint tests" in (REPO / ".ci" / "run").read_text()


@pytest.mark.parametrize(("page", "command"), ALL_COMMANDS,
                         ids=[f"{_page_id(p)}:{c[:60]}" for p, c in ALL_COMMANDS])
def test_every_documented_command_parses(page: Path, command: str):
    for tool, argv in bench_invocations(command):
        try:
            parse_with_the_tool(tool, argv)
        except SystemExit as exc:
            pytest.fail(f"{_page_id(page)}: `python -m bench.{tool} {shlex.join(argv)}` is refused (exit {exc.code})")
    for session in re.findall(r"\bnox -s ([\w-]+)", command):
        assert session in nox_sessions(), f"{_page_id(page)}: no nox session {session}"


def test_the_pages_hold_commands_of_every_tool():
    tools = {tool for _, cmd in ALL_COMMANDS for tool, _ in bench_invocations(cmd)}
    documented = {p.stem for p in (REPO / "bench").glob("*.py")} & {
        "run", "compare", "report", "parity", "calibrate", "predict", "slurm", "data"}
    assert documented <= tools


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_relative_link_leads_to_a_file(page: Path):
    for target in LINK.findall(page.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (page.parent / target).exists(), f"{_page_id(page)} links {target}, which does not exist"


def test_a_bad_command_is_caught():
    """The parse above can fail: an option no tool has is refused."""
    with pytest.raises(SystemExit):
        parse_with_the_tool("compare", ["--gpus", "1,2", "--no-such-option"])
