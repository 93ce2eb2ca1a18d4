"""nox sessions: tests, tests-fast, calibrate-idioms, slurm, mutation, lint, compare, parity, report, report-browser,
plan-check, gpu-wheels, gpu-check, and bench-<backend> for each backend.

On a CPU-only machine, export PIP_CONSTRAINT=$PWD/.ci/constraints-cpu.txt first so that pip
takes the CPU build of torch instead of the CUDA one (CI does this).
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).parent))  # nox loads this file without the repo on sys.path

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

from backends import BACKENDS  # noqa: E402  (the registry: one list of backends and their extras)
from bench.reporting.browser import find_chromium  # noqa: E402  (standard library only)
from tests.xdist_groups import QUIET_FILES  # noqa: E402  (standard library only: xdist and pytest imported in its hooks)

PASS_ENV = ("PARBENCH_DATA_DIR", "PARBENCH_REQUIRE_CLUSTER")


def _env() -> dict[str, str]:
    return {k: os.environ[k] for k in PASS_ENV if k in os.environ}


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """The test suite, on CPU, with real data from $PARBENCH_DATA_DIR: on pytest-xdist workers, one per core up to 4
    (tests/xdist_groups.py says how the files are shared), then the tests marked quiet alone; those marked by_hand
    are left to their own sessions (calibrate-idioms). With arguments, pytest with those instead."""
    session.install("-e", ".[torch,tf,mindspore,jax,dev]")
    if session.posargs:
        session.run("pytest", *session.posargs, env=_env())
        return
    # The cores this process may run on (a container's cpuset), not the host's.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = str(min(4, cores))
    failed = []
    for label, args in (("the suite", ["-n", workers, "-p", "tests.xdist_groups", "--no-loadscope-reorder",
                                       "-m", "not quiet and not by_hand"]),
                        ("the quiet tests", ["-m", "quiet and not by_hand", *QUIET_FILES])):
        try:
            session.run("pytest", "-q", *args, env=_env())
        except nox.command.CommandFailed:
            failed.append(label)  # the quiet tests still run, so that one session reports every failure
    if failed:
        session.error(f"failed: {' and '.join(failed)}")


@nox.session(python="3.11", name="calibrate-idioms")
def calibrate_idioms(session: nox.Session) -> None:
    """bench.calibrate end to end against each framework's bare loop, one backend at a time, which CI leaves out for
    their minutes (30-70 s each beside the other worker); CI's suite calibrates torch's through bench.gpu_check."""
    session.install("-e", ".[torch,tf,mindspore,dev]")
    session.run("pytest", "tests/test_calibrate.py", "-m", "by_hand", *(session.posargs or ["-q"]), env=_env())


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
    tests that reach it; then mutation.json, the table and docs/testing.md's generated section
    (tests/mutation_score.py). Not in CI (hours for every module). `-- --changed REF` mutates only the modules
    changed since REF and keeps mutation.json's rows of the modules unchanged since they were scored; other
    arguments after -- go to `mutmut run` (mutant names or globs, e.g. "common.stats*", or --max-children N).
    mutmut's first pass fails the session when a selected test fails without a mutant."""
    from tests.mutation_score import changed_since, mutated_globs

    args, keep = list(session.posargs), []
    if "--changed" in args:
        at = args.index("--changed")
        ref = args[at + 1]
        del args[at:at + 2]
        globs = mutated_globs(changed_since(ref))
        if not globs:
            session.log(f"no mutated module changed since {ref}")
            return
        args, keep = args + globs, ["--keep", "mutation.json"]
    session.install("-e", ".[dev]", "mutmut>=3.8,<4")  # the selected tests import no framework
    session.run("mutmut", "run", *args)
    session.run("python", "tests/mutation_score.py", *keep, "--docs", "docs/testing.md")


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


REFERENCE_SWEEP = "results/reference/h100x1"  # a real sweep, committed


def _ensure_chromium(session: nox.Session) -> None:
    """Debian's chromium through apt-get where no Chromium is installed (apt-get update first: a stale list
    names package versions the mirror no longer has)."""
    if find_chromium():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        session.error("no chromium, and installing Debian's needs root and apt-get")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run("apt-get", "update", "-q", external=True, env=env)
    session.run("apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium", external=True, env=env)


def _results_dir(args: list[str]) -> Path:
    for i, arg in enumerate(args):
        if arg == "--results" and i + 1 < len(args):
            return Path(args[i + 1])
        if arg.startswith("--results="):
            return Path(arg.split("=", 1)[1])
    return Path("results")


@nox.session(python="3.11", name="report-browser")
def report_browser(session: nox.Session) -> None:
    """report.html of a real sweep (default: the committed results/reference/h100x1) in headless Chromium: fails
    if an image did not load, the page logs to its console, or a table runs past the page width, after holding
    the check to broken pages; saves the page as report.png beside it. Installs Debian's chromium with apt-get
    where missing (needs root). Not in CI. Arguments after -- go to bench.report, e.g. -- --results DIR --sweep ID."""
    _ensure_chromium(session)
    session.install("-e", ".")
    args = session.posargs or ["--results", REFERENCE_SWEEP]
    results = _results_dir(args)
    session.run("python", "-m", "bench.report", *args)
    session.run("python", "-m", "bench.reporting.browser", str(results / "report.html"), "--self-test",
                "--screenshot", str(results / "report.png"))


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


@nox.session(python="3.11", name="plan-check")
def plan_check(session: nox.Session) -> None:
    """bench.plan against exhaustive measurement (not in CI: tens of minutes): every layout of 2 devices for the tiny
    and mini MLM measured, the planner's pick, ranking and fit calls held to their goals (docs/plan.md); arguments
    after -- go to bench.plan_check."""
    session.install("-e", ".[torch]")
    session.run("python", "-m", "bench.plan_check", *session.posargs, env=_env())


# What the lent GPU machine's image lacks for keras_jax (it has torch, JAX with CUDA, numpy, h5py, rich, absl-py,
# ml-dtypes): the versions the tests run, carried as wheels (docs/profiling.md, "On a GPU").
GPU_WHEELS = ("keras==3.15.1", "keras-hub==0.32.0", "namex==0.1.0", "optree==0.20.0", "kagglehub==1.0.2",
              "kagglesdk==0.1.28")
GPU_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


@nox.session(python="3.11", name="gpu-wheels")
def gpu_wheels(session: nox.Session) -> None:
    """Download into .whl/ (git-ignored) the wheels the GPU machine's Python 3.12 lacks for bench.gpu_check."""
    platforms = [arg for p in GPU_PLATFORMS for arg in ("--platform", p)]
    session.run("python", "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
                "--implementation", "cp", *platforms, "-d", ".whl", *GPU_WHEELS)


@nox.session(python="3.11", name="gpu-check")
def gpu_check(session: nox.Session) -> None:
    """bench.gpu_check on this machine's GPU (a workstation's; a lent one runs it without nox, docs/profiling.md);
    arguments after -- go to bench.gpu_check."""
    session.install("-e", ".[torch,jax]")
    session.run("python", "-m", "bench.gpu_check", *session.posargs, env=_env())
