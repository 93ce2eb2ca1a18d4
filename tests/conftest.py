"""Shared fixtures. Real data comes from $PARBENCH_DATA_DIR; its absence fails the tests, never skips them."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from common.data.files import DATA_DIR_ENV, FILES, resolve_data_dir

REPO = Path(__file__).resolve().parents[1]
E2E = "e2e"  # the marker of a test that starts processes: bench.run, launchers, workers (nox -s tests-fast skips them)


class _Marks:
    e2e = True  # outside a test (collection, session fixtures) nothing is guarded


def pytest_runtest_setup(item):
    # Before the test's fixtures are set up, so that a module-scoped fixture that starts runs counts too.
    _Marks.e2e = item.get_closest_marker(E2E) is not None


def pytest_runtest_teardown(item):
    _Marks.e2e = True


_popen_init = subprocess.Popen.__init__


def _guarded_popen_init(self, args, *rest, **kwargs):
    """A Python process started by a test that is not marked e2e fails it, also one started through another
    program (ip netns exec python ...): the fast session must stay fast, and a new end-to-end test must say so
    (pytest.mark.e2e). Other programs alone (git, ip) are cheap and allowed."""
    argv = [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()
    pythons = {Path(sys.executable).name, "python", "python3"}
    if not _Marks.e2e and any(Path(a).name in pythons or Path(a).name.startswith("python3.") for a in argv):
        raise AssertionError(f"this test starts a Python process ({' '.join(argv)[:120]}): mark it "
                             f"@pytest.mark.{E2E}")
    _popen_init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _guarded_popen_init

# JAX's persistent compilation cache, one folder for the whole session (xdist's workers and every process they
# start inherit it from the controller): the suite starts some 40 keras_jax processes that compile the same
# programs (each variable's initializer, the step), keyed by the program's hash, so a hit is the same executable.
# A keras_jax CNN run on 2 devices: 9.7 s cold, 5.0 s warm. A user's own JAX_COMPILATION_CACHE_DIR is kept.
JAX_CACHE_ENV = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"}
_jax_cache_made: list[str] = []


def pytest_configure(config):
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        _jax_cache_made.append(tempfile.mkdtemp(prefix="parbench-jax-cache-"))
        os.environ.update({"JAX_COMPILATION_CACHE_DIR": _jax_cache_made[0], **JAX_CACHE_ENV})


def pytest_unconfigure(config):
    for folder in _jax_cache_made:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def one_torch_thread():
    """A test that trains with torch in this process, on one torch thread: beside the other xdist worker, torch's
    OpenMP threads spin at every barrier (test_loop_warmup_exclusion with two busy cores beside it: 13.0 s at
    torch's 2 threads, 5.1 s at 1). Per test, not for the session: set for the whole worker it slowed
    TensorFlow's in-process tests there (test_two_replicas_equal_one_replica[mlm] 19.5 s, then 37-97 s)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    raw = os.environ.get(DATA_DIR_ENV)
    if not raw:
        pytest.fail(f"set {DATA_DIR_ENV} to a directory with the real data (CI uses ../shared/data)")
    path = resolve_data_dir()
    missing = [f.relpath for f in FILES if not (path / f.relpath).is_file()]
    if missing:
        pytest.fail(f"{DATA_DIR_ENV}={path} lacks {', '.join(missing)}")
    return path


def summary_record(run_id: str, devices: int, samples_per_s: float | None, started: str, *,
                   backend: str = "torch_ddp", precision: str = "fp32", host: str = "h1", workload: str = "mlm",
                   size: str = "tiny", status: str = "ok", virtual: bool = False, batch: int = 32,
                   sweep: str = "sweep-a", **fields) -> dict:
    """A run record with what the report's summary frame reads (128 tokens a sample), plus `fields`."""
    return {"run_id": run_id, "status": status, "workload": workload, "backend": backend, "strategy": backend,
            "devices": devices, "device_kind": "cpu", "virtual": virtual, "threads_per_device": 1,
            "scaling": "weak", "per_device_batch": batch, "global_batch": batch * devices, "data": "synthetic",
            "sweep_id": sweep, "config": {"precision": precision, "model_size": size}, "host": {"name": host},
            "started_at": started, "samples_per_s": samples_per_s,
            "tokens_per_s": None if samples_per_s is None else samples_per_s * 128, **fields}


def run_cli(module: str, *args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `python -m module args` from the repo root, as a user would."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          env=full_env, timeout=timeout)


def run_on_jax(script: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -c script` from the repo root with Keras on JAX: a test process's Keras may be on TensorFlow already
    (test_tf_mirrored imports it at collection), and Keras takes its backend once, at its first import."""
    return subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "KERAS_BACKEND": "jax"})


def json_on_jax(script: str, timeout: float = 120):
    """What `script`, run as run_on_jax runs it, printed as JSON on its last line; its stderr's tail if it failed."""
    done = run_on_jax(script, timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def run_in_process(module: str, *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `python -m module args` run as a call of its main() in this process: the same
    code without an interpreter's start-up. The signal handlers main() installs are put back."""
    import contextlib
    import importlib
    import io
    import signal

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = importlib.import_module(module).main(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return code, out.getvalue(), err.getvalue()


def run_recorded(out: Path, *args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, dict | None]:
    """bench.run with `args` into `out`; (the process, the newest record in out/runs, or None)."""
    proc = run_cli("bench.run", *args, "--out", str(out), env=env)
    records = sorted((out / "runs").glob("*.json"), key=lambda p: p.stat().st_mtime)
    return proc, (json.loads(records[-1].read_text()) if records else None)


# --profile 2: two more steps under torch.profiler after the measured ones (common.profile), checked by
# assert_profiled in test_torch_dp and test_torch_ddp.
TORCH_SWEEP = ("--gpus", "1,2", "--backends", "torch_dp,torch_ddp", "--workloads", "cnn", "--data", "real",
               "--steps", "8", "--warmup-steps", "2", "--profile", "2")


@pytest.fixture(scope="session")
def torch_sweep(tmp_path_factory, data_dir) -> tuple[subprocess.CompletedProcess, Path]:
    """One bench.compare of both torch backends at 1 and 2 devices on real MNIST, evaluated (the process and
    its --out): test_torch_dp and test_torch_ddp read its records instead of each starting its own."""
    out = tmp_path_factory.mktemp("torch-sweep") / "results"
    return run_cli("bench.compare", *TORCH_SWEEP, "--out", str(out)), out


# torch_3d's tiny BERT on real WikiText-2 at global batch 8, 3 steps: the 1-device run and the dp2 and tp2 layouts
# are test_torch_3d's reference and two of its layouts as well.
LAYOUT_SWEEP = ("--layouts", "dp2,tp2", "--workloads", "mlm", "--model-size", "tiny", "--data", "real", "--steps", "3",
                "--warmup-steps", "1", "--skip-eval", "--batch-size", "8", "--threads-per-device", "1",
                "--profile", "2", "--memory-per-device", "16",  # the fit check lets them run (test_plan)
                "--co-run-probe")  # the 1-device run again as two processes side by side (test_predict)


@pytest.fixture(scope="session")
def layout_sweep(tmp_path_factory, data_dir) -> tuple[subprocess.CompletedProcess, Path]:
    """One bench.compare --layouts sweep (the process and its --out), read by test_layouts and test_torch_3d."""
    out = tmp_path_factory.mktemp("layout-sweep") / "results"
    return run_cli("bench.compare", *LAYOUT_SWEEP, "--out", str(out), timeout=900), out


@pytest.fixture
def foreign_python_path(tmp_path) -> str:
    """A PATH whose first `python` is not this interpreter but a shim that fails: what a user has who
    calls the venv's python by path without activating the venv."""
    shim_dir = tmp_path / "foreign-bin"
    shim_dir.mkdir()
    for name in ("python", "python3"):
        shim = shim_dir / name
        shim.write_text("#!/bin/sh\necho 'the foreign python ran' >&2\nexit 1\n")
        shim.chmod(0o755)
    return os.pathsep.join([str(shim_dir), os.environ.get("PATH", "")])


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of a TensorBoard log, read back by TensorBoard's own reader (the plugin-aware one:
    summaries are written as tensors with the scalars plugin's metadata, as TensorBoard's UI reads them)."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, float(make_ndarray(e.tensor_proto))) for e in events.Tensors(tag)]
            for tag in events.Tags()["tensors"]}


def assert_tensorboard_log_is_the_record(log_root: Path, record: dict) -> None:
    """--tensorboard: the run's log under LOG_ROOT/<run id> holds the record's loss curve and evaluations."""
    scalars = tensorboard_scalars(log_root / record["run_id"])
    loss = dict(scalars["train/loss"])
    assert [[step, pytest.approx(value, rel=1e-6)] for step, value in record["loss"]["curve"]] == \
        [[step, loss[step]] for step, _ in record["loss"]["curve"]]
    assert len(scalars["perf/step_time_s"]) == len(record["step_times_s"])
    assert [s for s, _ in scalars["train/learning_rate"]] == [s for s, _ in record["loss"]["curve"]]
    evals = [(p["step"], pytest.approx(p["value"], rel=1e-6)) for p in record.get("eval_history") or []]
    metric = [tag for tag in scalars if tag.startswith("eval/") and tag != "eval/loss"]
    assert [(s, v) for s, v in scalars[metric[0]]] == evals if evals else not metric


def assert_profiled(record: dict, open_trace, steps: int = 2) -> None:
    """--profile STEPS: rank 0's trace under the record's trace_dir opens with the framework's own reader
    (`open_trace(rank folder)` returns how many step annotations, or for MindSpore op events, it read), and
    backend_metrics.attribution has every category, shares adding up to the profiled step within 10%, its seconds
    to the step the loop's clock measured."""
    from common.sections import ATTRIBUTION_CATEGORIES, Attribution

    section = Attribution.from_metrics(record["backend_metrics"])
    assert section is not None and section.steps == steps
    assert set(section.categories) == set(ATTRIBUTION_CATEGORIES)
    assert sum(c.share for c in section.categories.values()) == pytest.approx(1.0, rel=0.10)
    assert sum(c.seconds for c in section.categories.values()) == pytest.approx(section.wall_step_s, rel=0.10)
    assert section.categories["matmul"].share > 0.05  # the profiler's ops were read and classified
    assert section.categories["other"].share < 0.10, section.unclassified
    assert section.measured_step_s == pytest.approx(record["step_time_s"]["p50"], rel=0.5)
    assert Path(section.trace_dir).name == record["run_id"]
    assert open_trace(Path(section.trace_dir) / "rank0") >= steps


def chrome_trace_steps(folder: Path) -> int:
    """The step annotations of the Chrome/Perfetto trace(s) torch writes in `folder`, read as that format is: JSON."""
    from common.attribution import STEP_MARKER

    traces = list(folder.glob("*.pt.trace.json"))
    assert traces, f"no trace in {folder}"
    return sum(e.get("name") == STEP_MARKER and e.get("ph") == "X" for t in traces
               for e in json.loads(t.read_text())["traceEvents"])
