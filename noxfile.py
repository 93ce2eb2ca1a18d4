"""nox sessions: tests, tests-fast, slurm, mutation, lint, compare, parity, report, and bench-<backend> for each
backend.

On a CPU-only machine, export PIP_CONSTRAINT=$PWD/.ci/constraints-cpu.txt first so that pip
takes the CPU build of torch instead of the CUDA one (CI does this).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).parent))  # nox loads this file without the repo on sys.path

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

from backends import BACKENDS  # noqa: E402  (the registry: one list of backends and their extras)

PASS_ENV = ("PARBENCH_DATA_DIR", "PARBENCH_REQUIRE_CLUSTER")


def _env() -> dict[str, str]:
    return {k: os.environ[k] for k in PASS_ENV if k in os.environ}


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """The test suite, on CPU, with real data from $PARBENCH_DATA_DIR."""
    session.install("-e", ".[torch,tf,mindspore,jax,dev]")
    session.run("pytest", *(session.posargs or ["-q"]), env=_env())


@nox.session(python="3.11", name="tests-fast")
def tests_fast(session: nox.Session) -> None:
    """The unit tests only (no process started: tests marked e2e are left out), in a few minutes."""
    session.install("-e", ".[torch,tf,mindspore,jax,dev]")
    session.run("pytest", "-m", "not e2e", *(session.posargs or ["-q"]), env=_env())


@nox.session(python="3.11")
def slurm(session: nox.Session) -> None:
    """tests/test_slurm.py alone: bench.slurm and bench.run against a real slurmctld and two slurmd in two network
    namespaces (needs root; installs slurm-wlm and munge with apt-get where missing, skips with the reason where
    it cannot). The full suite runs it too."""
    session.install("-e", ".[torch,tf,dev]")
    session.run("pytest", "tests/test_slurm.py", *(session.posargs or ["-q"]), env=_env())


@nox.session(python="3.11")
def mutation(session: nox.Session) -> None:
    """mutmut on the code whose mistakes are silent (pyproject.toml's [tool.mutmut]), each mutant against the fast
    tests that reach it; then mutation.json and the table of tests/mutation_score.py (docs/testing.md). Not in CI:
    4,253 mutants took 31 min on 2 loaded cores (-- --max-children 3). Arguments after -- go to `mutmut run`
    (mutant names or globs, e.g. "common.stats*"). mutmut's first pass fails the session when a selected test
    fails without a mutant."""
    session.install("-e", ".[dev]", "mutmut>=3.8,<4")  # the selected tests import no framework
    session.run("mutmut", "run", *session.posargs)
    session.run("python", "tests/mutation_score.py")


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.5")
    session.run("ruff", "check", ".")


@nox.session(python="3.11")
def compare(session: nox.Session) -> None:
    """A sweep; arguments after -- go to bench.compare (default: the torch backends at 1 and 2 devices)."""
    session.install("-e", ".[torch]")
    args = session.posargs or ["--gpus", "1,2", "--backends", "torch_ddp"]
    session.run("python", "-m", "bench.compare", *args, env=_env())


@nox.session(python="3.11")
def parity(session: nox.Session) -> None:
    """bench.parity: every backend runs the same experiment; arguments after -- go to bench.parity."""
    session.install("-e", ".[torch,tf,mindspore,jax]")
    session.run("python", "-m", "bench.parity", *(session.posargs or ["--data", "synthetic"]), env=_env())


@nox.session(python="3.11")
def report(session: nox.Session) -> None:
    """report.md, report.html and plots/ from the records in results/; arguments after -- go to bench.report."""
    session.install("-e", ".")  # reading records and plotting needs no framework
    session.run("python", "-m", "bench.report", *session.posargs)


def _bench_session(backend: str) -> None:
    entry = BACKENDS[backend]

    @nox.session(python="3.11", name=f"bench-{backend}")
    def bench(session: nox.Session) -> None:
        """One backend at 1 and 2 devices on both workloads; real data when downloaded, else synthetic."""
        if entry.module is None:
            session.error(f"backend {backend} is not built yet ({entry.pending})")
        session.install("-e", f".[{entry.extra}]")
        args = session.posargs or ["--gpus", "1,2"]
        session.run("python", "-m", "bench.compare", "--backends", backend, *args, env=_env())


for _name in BACKENDS:
    _bench_session(_name)
