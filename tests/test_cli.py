"""CONVENTIONS §3 at the command line: bad input is exit 2 with one line and no record; a valid run
this machine cannot do is exit 3 with a record saying why."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from common.devices import accelerator_driver_present
from common.results import validate_record
from tests.conftest import REPO, run_cli, run_in_process

BASE = ["--backend", "torch_ddp", "--workload", "cnn", "--devices", "1"]
MLM2 = ["--backend", "torch_3d", "--workload", "mlm", "--model-size", "tiny", "--devices", "2"]
OUT = "{out}"  # replaced by a fresh folder per case; nothing may appear in it

# One table for every tool (issue #8): (tool, arguments). Each must exit 2 with exactly one line on
# stderr, no traceback, and write nothing: no record, no report, no data file.
BAD_INPUT = {
    "run: missing backend": ("bench.run", ["--workload", "cnn", "--devices", "1", "--out", OUT]),
    "run: unknown backend": ("bench.run", ["--backend", "nope", "--workload", "cnn", "--devices", "1", "--out", OUT]),
    "run: unknown workload": ("bench.run", ["--backend", "torch_ddp", "--workload", "gpt", "--devices", "1",
                                            "--out", OUT]),
    "run: zero devices": ("bench.run", ["--backend", "torch_ddp", "--workload", "cnn", "--devices", "0", "--out", OUT]),
    "run: devices not a number": ("bench.run", ["--backend", "torch_ddp", "--workload", "cnn", "--devices", "two",
                                                "--out", OUT]),
    "run: zero steps": ("bench.run", [*BASE, "--steps", "0", "--out", OUT]),
    "run: steps and epochs": ("bench.run", [*BASE, "--steps", "5", "--epochs", "1", "--out", OUT]),
    "run: negative epochs": ("bench.run", [*BASE, "--epochs", "-1", "--out", OUT]),
    "run: negative batch": ("bench.run", [*BASE, "--batch-size", "-4", "--out", OUT]),
    "run: unknown scaling": ("bench.run", [*BASE, "--scaling", "diagonal", "--out", OUT]),
    "run: unknown data mode": ("bench.run", [*BASE, "--data", "imaginary", "--out", OUT]),
    "run: real data missing": ("bench.run", [*BASE, "--data", "real", "--data-dir", "/nonexistent/parbench",
                                             "--out", OUT]),
    "run: patience without eval": ("bench.run", [*BASE, "--patience", "2", "--out", OUT]),
    "run: a size lm does not have": ("bench.run", ["--backend", "torch_ddp", "--workload", "lm", "--devices", "1",
                                                   "--model-size", "small", "--out", OUT]),
    "run: skip-eval with eval-every": ("bench.run", [*BASE, "--skip-eval", "--eval-every", "2", "--out", OUT]),
    "run: skip-eval with eval-samples": ("bench.run", [*BASE, "--skip-eval", "--eval-samples", "64", "--out", OUT]),
    "run: warm-up swallows the run": ("bench.run", [*BASE, "--steps", "5", "--warmup-steps", "5", "--out", OUT]),
    "run: strong batch not divisible": ("bench.run", ["--backend", "torch_ddp", "--workload", "cnn", "--devices", "2",
                                                      "--scaling", "strong", "--batch-size", "3", "--out", OUT]),
    "run: global batch beyond the dataset": ("bench.run", [*BASE, "--batch-size", "100000", "--data", "synthetic",
                                                           "--out", OUT]),
    "run: zero timeout": ("bench.run", [*BASE, "--timeout", "0", "--out", OUT]),
    "run: perturbation of 100%": ("bench.run", [*BASE, "--init-perturbation", "1", "--out", OUT]),
    "run: perturbation not a number": ("bench.run", [*BASE, "--init-perturbation", "tiny", "--out", OUT]),
    "run: resume without checkpoints": ("bench.run", [*BASE, "--resume", "--out", OUT]),
    "run: unknown model size": ("bench.run", [*BASE, "--model-size", "huge", "--out", OUT]),
    "run: unknown flag": ("bench.run", [*BASE, "--frobnicate", "--out", OUT]),
    "run: unknown precision": ("bench.run", [*BASE, "--precision", "fp8", "--out", OUT]),
    "run: negative max-restarts": ("bench.run", [*BASE, "--max-restarts", "-1", "--out", OUT]),
    "run: max-restarts without checkpoints": ("bench.run", [*BASE, "--max-restarts", "2", "--out", OUT]),
    "run: profile-dir without profile": ("bench.run", [*BASE, "--profile-dir", OUT, "--out", OUT]),
    # An option of one backend (the registry declares whose) is bad input for the others.
    "run: a MindSpore mode for torch_ddp": ("bench.run", [*BASE, "--parallel-mode", "semi_auto", "--out", OUT]),
    "run: a TF mode for torch_3d": ("bench.run", [*MLM2, "--tf-mode", "multi_worker", "--out", OUT]),
    "run: max-restarts on a backend without": ("bench.run", ["--backend", "torch_dp", "--workload", "cnn",
                                                             "--devices", "1", "--max-restarts", "1",
                                                             "--checkpoint-every", "2", "--out", OUT]),
    # The parallel layout is validated once, for every backend (common/layout.py).
    "run: layout leaves no whole replica": ("bench.run", [*MLM2, "--model-parallel", "4", "--out", OUT]),
    "run: heads not divisible": ("bench.run", [*MLM2[:-1], "3", "--model-parallel", "3", "--out", OUT]),
    "run: layers cannot fill the stages": ("bench.run", [*MLM2[:-1], "4", "--pipeline-stages", "4",
                                                         "--micro-batches", "4", "--out", OUT]),
    "run: fewer micro-batches than stages": ("bench.run", [*MLM2, "--pipeline-stages", "2", "--out", OUT]),
    "run: micro-batches without a pipeline": ("bench.run", [*MLM2, "--micro-batches", "2", "--out", OUT]),
    "run: schedule without a pipeline": ("bench.run", [*MLM2, "--pipeline-schedule", "1f1b", "--out", OUT]),
    "run: unknown schedule": ("bench.run", [*MLM2, "--pipeline-stages", "2", "--micro-batches", "2",
                                            "--pipeline-schedule", "zb", "--out", OUT]),
    "run: grad-accum in a pipeline": ("bench.run", [*MLM2, "--pipeline-stages", "2", "--micro-batches", "2",
                                                    "--grad-accum", "2", "--out", OUT]),
    "run: vocabulary not divisible": ("bench.run", [*MLM2[:-3], "mini", "--devices", "4", "--model-parallel", "4",
                                                    "--vocab-split", "--out", OUT]),
    "run: strong batch over replicas and micro-batches": ("bench.run", [*MLM2, "--pipeline-stages", "2",
                                                                        "--micro-batches", "2", "--scaling",
                                                                        "strong", "--batch-size", "5", "--out", OUT]),
    "compare: zero devices": ("bench.compare", ["--gpus", "0,1", "--out", OUT]),
    "compare: letters": ("bench.compare", ["--gpus", "a,b", "--out", OUT]),
    "compare: an empty device count": ("bench.compare", ["--gpus", "1,,2", "--out", OUT]),
    "compare: unknown backend": ("bench.compare", ["--backends", "torch_ddp,caffe", "--out", OUT]),
    "compare: unknown workload": ("bench.compare", ["--workloads", "rnn", "--out", OUT]),
    "compare: bad timeout": ("bench.compare", ["--timeout", "soon", "--out", OUT]),
    # Bad for every run of the sweep: refused before it starts, with bench.run's own checks (issue #16).
    "compare: real data missing": ("bench.compare", ["--gpus", "1,2", "--data", "real", "--data-dir",
                                                     "/nonexistent/parbench", "--out", OUT]),
    "compare: warm-up swallows every run": ("bench.compare", ["--steps", "5", "--warmup-steps", "5", "--out", OUT]),
    "compare: strong batch divides no N": ("bench.compare", ["--gpus", "2,4", "--scaling", "strong",
                                                             "--batch-size", "3", "--out", OUT]),
    "compare: patience without eval": ("bench.compare", ["--patience", "2", "--out", OUT]),
    "report: no results folder": ("bench.report", ["--results", "{out}/missing"]),
    "report: no records": ("bench.report", ["--results", OUT]),
    "report: bad date": ("bench.report", ["--results", OUT, "--since", "yesterday"]),
    "report: unknown workload": ("bench.report", ["--results", OUT, "--workload", "gpt"]),
    "report: unknown backend": ("bench.report", ["--results", OUT, "--backends", "caffe"]),
    "data: no command": ("bench.data", ["--data-dir", OUT]),
    "data: unknown command": ("bench.data", ["fetch", "--data-dir", OUT]),
    "data: unknown dataset": ("bench.data", ["download", "--datasets", "imagenet", "--data-dir", OUT]),
    "data: unknown flag": ("bench.data", ["verify", "--quick", "--data-dir", OUT]),
}


def _files(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _bad_input_holds(tmp_path, tool: str, args: list[str], run) -> None:
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)  # an empty results folder: bench.report must find nothing to report
    code, stderr = run(tool, [a.replace(OUT, str(out)) for a in args])
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert code == 2, stderr
    assert len(lines) == 1 and lines[0].startswith(f"{tool}: error:"), stderr
    assert "Traceback" not in stderr
    assert _files(tmp_path) == [], "bad input wrote files"


@pytest.mark.parametrize("tool, args", BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_is_exit_2_one_line_and_nothing_written(tmp_path, tool, args):
    """Each case through the tool's main() in this process: the checks are the tool's own code either way."""
    def in_process(tool, argv):
        code, _, stderr = run_in_process(tool, *argv)
        return code, stderr
    _bad_input_holds(tmp_path, tool, args, in_process)


# One case per tool as a user's shell runs it: the interpreter adds nothing (no traceback, no second line).
AS_A_PROCESS = {tool: case for case, (tool, _) in reversed(BAD_INPUT.items())}


@pytest.mark.e2e
@pytest.mark.parametrize("case", sorted(AS_A_PROCESS.values()))
def test_bad_input_as_a_process_is_exit_2_one_line_and_nothing_written(tmp_path, case):
    def as_process(tool, argv):
        proc = run_cli(tool, *argv)
        return proc.returncode, proc.stderr
    _bad_input_holds(tmp_path, *BAD_INPUT[case], as_process)


def test_the_bad_input_table_covers_every_tool():
    tools = [tool for tool, _ in BAD_INPUT.values()]
    assert len(tools) >= 20 and set(tools) == {"bench.run", "bench.compare", "bench.report", "bench.data"}


@pytest.mark.e2e
@pytest.mark.parametrize("tool, args", [("bench.run", BASE), ("bench.compare", ["--gpus", "1"])])
def test_out_that_is_a_file_is_bad_input(tmp_path, tool, args):
    target = tmp_path / "file"
    target.write_text("x")
    proc = run_cli(tool, *args, "--out", str(target))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"{tool}: error: --out {target}: exists and is not a directory")
    assert _files(tmp_path) == ["file"]


@pytest.mark.e2e
def test_report_names_a_results_path_that_is_a_file(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    proc = run_cli("bench.report", "--results", str(target))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "is a file, not a results directory" in proc.stderr


@pytest.mark.e2e
def test_a_sweep_records_a_run_invalid_at_one_device_count_as_invalid(tmp_path):
    """A global batch of 3 divides over 1 device, not 2: the N=2 run is a configuration error, recorded
    and reported as `invalid` (not `unsupported`, which says the machine cannot), and the sweep goes on."""
    out = tmp_path / "out"
    proc = run_cli("bench.compare", "--gpus", "1,2", "--backends", "torch_dp", "--workloads", "cnn", "--scaling",
                   "strong", "--batch-size", "3", "--steps", "2", "--warmup-steps", "1", "--skip-eval", "--data",
                   "synthetic", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    records = {r["devices"]: r for r in (json.loads(p.read_text()) for p in (out / "runs").glob("*.json"))}
    assert records[1]["status"] == "ok"
    invalid = records[2]
    assert invalid["status"] == "invalid" and validate_record(invalid) == []
    assert invalid["error"] == ("invalid for 2 device(s): --scaling strong: global batch 3 is not divisible by "
                                "2 data-parallel replicas x 1 micro-batches")
    assert run_cli("bench.report", "--results", str(out)).returncode == 0
    report = (out / "report.md").read_text()
    assert "| invalid |" in report and "1 ok, 0 failed, 0 unsupported, 1 invalid" in report


UNSUPPORTED = {
    "cuda on a machine without": ([*BASE, "--device-kind", "cuda"], "CUDA devices requested"),
    "SyncBatchNorm on CPU ranks": (["--backend", "torch_ddp", "--workload", "cnn", "--devices", "2", "--sync-bn"],
                                   "SyncBatchNorm"),
    # A data-parallel backend refuses a layout flag by name, and says which backend runs it.
    "torch_ddp and a tensor-parallel layout": (["--backend", "torch_ddp", "--workload", "mlm", "--devices", "2",
                                                "--model-parallel", "2"], "--model-parallel 2: torch_ddp"),
    "torch_dp and recompute": (["--backend", "torch_dp", "--workload", "cnn", "--devices", "1",
                                          "--recompute"], "--recompute full: torch_dp"),
    "tf_mirrored and a pipeline": (["--backend", "tf_mirrored", "--workload", "mlm", "--devices", "2",
                                    "--pipeline-stages", "2", "--micro-batches", "2"],
                                   "--pipeline-stages 2: tf_mirrored"),
    "torch_3d and a tensor-parallel CNN": (["--backend", "torch_3d", "--workload", "cnn", "--devices", "2",
                                            "--model-parallel", "2"], "--model-parallel"),
    # A layout backend refuses, by flag, what its registry entry does not execute, and names who does.
    "torch_3d and sequence parallelism": (["--backend", "torch_3d", "--workload", "mlm", "--devices", "2",
                                           "--model-parallel", "2", "--sequence-parallel"],
                                          "--sequence-parallel: torch_3d does not execute it; no backend here does "
                                          "(bench.predict and bench.plan model it)"),
    "keras_jax and a pipeline, in its own words": (["--backend", "keras_jax", "--workload", "mlm", "--devices", "2",
                                                    "--pipeline-stages", "2", "--micro-batches", "2"],
                                                   "keras.distribution has no pipeline parallelism"),
    "mindspore_auto and context parallelism": (["--backend", "mindspore_auto", "--workload", "mlm", "--devices",
                                                "2", "--context-parallel", "2", "--parallel-mode", "semi_auto"],
                                               "--context-parallel 2: mindspore_auto does not execute it"),
    "torch_3d and HSDP": (["--backend", "torch_3d", "--workload", "mlm", "--devices", "4", "--fsdp", "2"],
                          "--fsdp 2: torch_3d does not execute it; no backend here does"),
    "a torch.compile mode for XLA": (["--backend", "tf_mirrored", "--workload", "cnn", "--devices", "1",
                                      "--compile", "max-autotune"], "XLA (jit_compile) has no modes"),
    # tp 4 is a valid decoder layout (Megatron replicates the 2 key/value heads), which keras_jax does not lay out.
    "keras_jax and more tensor-parallel devices than key/value heads": (
        ["--backend", "keras_jax", "--workload", "lm", "--devices", "4", "--model-parallel", "4"],
        "keras_jax lm --model-parallel 4: llama-tiny's 2 key/value heads do not split over it"),
    "mindspore_auto lm and key/value heads tp does not divide": (
        ["--backend", "mindspore_auto", "--workload", "lm", "--devices", "4", "--parallel-mode", "semi_auto",
         "--model-parallel", "4"], "llama-tiny's 2 key/value heads do not split over it"),
    "bfloat16 on mindspore_auto": (["--backend", "mindspore_auto", "--workload", "cnn", "--devices", "1",
                                    "--precision", "amp"], "no bfloat16 CPU kernels"),
}


@pytest.mark.parametrize("args, reason", UNSUPPORTED.values(), ids=UNSUPPORTED.keys())
def test_unsupported_writes_a_record_and_exits_3(tmp_path, args, reason):
    """Refused by the backend's check in bench.run's own process, before anything starts: main() in this process."""
    out = tmp_path / "out"
    code, _, stderr = run_in_process("bench.run", *args, "--data", "synthetic", "--out", str(out))
    assert code == 3, stderr
    [path] = (out / "runs").glob("*.json")
    record = json.loads(path.read_text())
    assert record["status"] == "unsupported" and reason in record["error"]
    assert validate_record(record) == []


@pytest.mark.e2e
@pytest.mark.skipif(accelerator_driver_present(), reason="with a GPU driver the parent asks the framework for GPUs")
def test_planning_a_run_imports_no_framework():
    """bench.run's own process plans every backend's run without importing its framework (TensorFlow took 5 s of
    every run): versions from the installed packages, no GPUs where no driver is."""
    code = ("import sys; from backends import BACKENDS, load_backend\n"
            "for name in BACKENDS:\n"
            "    backend = load_backend(name); backend.framework_version(); backend.plan_devices(1, 'auto', 1)\n"
            "print(sorted({'torch', 'tensorflow', 'mindspore', 'jax', 'keras'} & set(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"
