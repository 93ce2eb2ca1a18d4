"""bench.compare without a framework: its options and refusals, the plan a sweep builds (which backend x devices x
workload x layout runs, in which order, with which bench.run command line), what it records for a run bench.run
could not record, how it launches, stops and cancels a run, the tables and lines it prints, and one whole sweep in
this process with bench.run's part played by a stand-in that writes the record bench.run would (the real sweeps,
which need a framework, are the e2e tests of test_cli, test_cancel and test_layouts)."""
from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from argparse import Namespace
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from bench import compare
from bench.compare import (
    HARNESS_MARGIN_S,
    SweepCancelled,
    bad_input,
    build_parser,
    cancelled,
    launch,
    print_interval_table,
    print_layout_table,
    print_table,
    probed_runs,
    record_harness_failure,
    refusal,
    repeat_order,
    run_command,
    run_one,
    stop_run,
    sweep_plan,
)
from bench.layouts import parse_layout
from common.errors import BadInput, Cancelled
from common.launch import cancel_on_signals
from common.layout import Layout
from common.plan.fit import DoesNotFit
from common.record import skeleton
from common.results import load_records, write_record
from common.sections import CoRun, FitCheck
from tests.conftest import run_in_process


def _flat(text: str) -> str:
    return " ".join(text.split())


def _args(*argv: str, **set_after) -> Namespace:
    """bench.compare's arguments as main() leaves them before the plan (devices and backends filled in)."""
    args = build_parser().parse_args(list(argv))
    args.devices = args.devices or [1, 2]
    args.backends = args.backends or ["torch_ddp"]
    args.srun, args.job_nodes = False, 0
    for key, value in set_after.items():
        setattr(args, key, value)
    return args


def _tail(cmd: list[str]) -> list[str]:
    """A bench.run command line after the interpreter."""
    assert cmd[:3] == [sys.executable, "-m", "bench.run"], cmd
    return cmd[3:]


# ----------------------------------------------------------------------------- options

def test_help_says_what_the_sweep_s_own_options_do(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option: argparse would wrap at hyphens
    code, out, _ = run_in_process("bench.compare", "--help")
    text = _flat(out)
    assert code == 0
    assert text.startswith("usage: bench.compare [-h] [--gpus DEVICES] [--layouts LAYOUTS] [--backends BACKENDS] "
                           "[--workloads WORKLOADS] [--repeats REPEATS] [--co-run-probe] [--srun] [--steps STEPS]")
    # The module docstring's first paragraph is the description, the run options follow the sweep's own.
    own = text.split(" python -m bench.compare --gpus 1,2,4", 1)[1].split(" run options: ", 1)[0]
    assert own == (
        " [--backends a,b] [--workloads cnn,mlm] [run options] python -m bench.compare --layouts "
        "dp2,tp2,pp2-nmb4-1f1b [--backends torch_3d] [--workloads mlm] [run options] options: -h, --help show this "
        "help message and exit --gpus DEVICES, --devices DEVICES device counts to sweep, e.g. 1,2,4 (default 1,2; "
        "CUDA when present, else virtual CPU devices) --layouts LAYOUTS parallel layouts to sweep instead of device "
        "counts, e.g. dp2,tp2,pp2-nmb4-1f1b,fsdp2,dp2xtp2 (docs/layouts.md); each at the devices it implies, one "
        "global batch for all --backends BACKENDS default: every backend; with --layouts, the one that runs every "
        "layout (torch_3d) --workloads WORKLOADS default: cnn,mlm (lm, the decoder LM, when asked for) --repeats "
        "REPEATS run every row R times, the rows interleaved in each repeat (order reversed every other repeat), "
        "and report each row's median and 95% interval (docs/comparison.md) --co-run-probe on a CPU host, after the "
        "plan's first 1-device run of each backend and workload (every repeat of it), run it again as the sweep's "
        "largest device count of processes side by side, and write how much they slow each other into its record "
        "(bench.co_run; bench.predict uses their median) --srun inside a SLURM job (sbatch): run each bench.run as "
        "a job step over every node of the job, one task per node (bench.slurm's scripts do this); --gpus is then "
        "per node")


def test_the_sweep_s_defaults_and_how_its_lists_parse():
    args = build_parser().parse_args([])
    assert (args.devices, args.layouts, args.backends, args.workloads, args.repeats, args.co_run_probe,
            args.srun) == (None, None, None, ["cnn", "mlm"], 1, False, False)
    args = build_parser().parse_args(["--devices", "4,1", "--backends", "torch_dp,keras_jax", "--workloads", "lm",
                                      "--repeats", "3", "--co-run-probe", "--srun", "--layouts", "tp2,dp2"])
    assert (args.devices, args.backends, args.workloads, args.repeats, args.co_run_probe, args.srun) == \
        ([1, 4], ["torch_dp", "keras_jax"], ["lm"], 3, True, True)  # the counts in order
    assert [lay.name for lay in args.layouts] == ["tp2", "dp2"]
    assert build_parser().parse_args(["--gpus", "2"]).devices == [2]


@pytest.mark.parametrize("argv, says", [
    (["--repeats", "0"], "argument --repeats: "),
    (["--workloads", "cnn,gpt"], "argument --workloads: "),
    (["--backends", "torch_ddp,caffe"], "argument --backends: "),
])
def test_a_bad_list_or_count_is_refused_before_anything_runs(tmp_path, argv, says):
    code, _, stderr = run_in_process("bench.compare", *argv, "--out", str(tmp_path / "out"))
    assert code == 2 and stderr.startswith(f"bench.compare: error: {says}") and stderr.count("\n") == 1, stderr
    assert not (tmp_path / "out").exists()


def test_srun_outside_a_slurm_job_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    code, _, stderr = run_in_process("bench.compare", "--srun", "--out", str(tmp_path / "out"))
    assert code == 2
    assert stderr == "bench.compare: error: --srun: not inside a SLURM job (no SLURM_JOB_ID and " \
        "SLURM_JOB_NUM_NODES): submit the script with sbatch, or start this from salloc\n"
    assert not (tmp_path / "out").exists()


def test_a_sweep_bad_for_every_run_says_each_reason_once(tmp_path):
    # Batch 6 at 4 and 5 devices: two runs, two reasons; at 4 and 4, one reason said once.
    out = tmp_path / "out"
    code, _, stderr = run_in_process("bench.compare", "--gpus", "4,5,4", "--backends", "torch_ddp", "--workloads",
                                     "cnn,mlm", "--scaling", "strong", "--batch-size", "6", "--out", str(out))
    assert code == 2 and not out.exists()
    assert stderr == "bench.compare: error: --scaling strong: global batch 6 is not divisible by 4 data-parallel " \
        "replicas x 1 micro-batches; --scaling strong: global batch 6 is not divisible by 5 data-parallel replicas " \
        "x 1 micro-batches\n"


def test_layouts_set_strong_scaling_and_refuse_a_layout_flag_of_their_own():
    args = build_parser().parse_args(["--layouts", "dp2"])
    compare.check_layout_options(build_parser(), args)
    assert args.scaling == "strong" and args.backends == ["torch_3d"]
    args = build_parser().parse_args(["--layouts", "dp2", "--backends", "torch_ddp", "--scaling", "strong"])
    compare.check_layout_options(build_parser(), args)
    assert args.scaling == "strong" and args.backends == ["torch_ddp"]


@pytest.mark.parametrize("flags, says", [
    (["--pipeline-stages", "2"], "--layouts sets the layout of every run; drop --pipeline-stages"),
    (["--recompute", "full"], "--layouts sets the layout of every run; drop --recompute"),
    (["--grad-accum", "2", "--micro-batches", "2"], "--layouts sets the layout of every run; drop --micro-batches"),
    (["--gpus", "2"], "--layouts sets the device count of every run (dp x tp x pp); drop --gpus/--devices"),
    (["--scaling", "weak"], "--layouts compares layouts at one global batch (strong scaling); drop --scaling weak"),
])
def test_layouts_refuse_what_contradicts_them_word_for_word(capsys, flags, says):
    args = build_parser().parse_args(["--layouts", "dp2", *flags])
    with pytest.raises(SystemExit) as exit_:
        compare.check_layout_options(build_parser(), args)
    assert exit_.value.code == 2 and capsys.readouterr().err.endswith(f"bench.compare: error: {says}\n")


def test_layouts_without_backends_and_no_layout_backend_registered_are_refused(capsys, monkeypatch):
    from bench import cli
    monkeypatch.setattr(cli, "layout_backend", lambda: None)
    with pytest.raises(SystemExit) as exit_:
        compare.check_layout_options(build_parser(), build_parser().parse_args(["--layouts", "dp2"]))
    assert exit_.value.code == 2 and capsys.readouterr().err.endswith(
        "bench.compare: error: --layouts runs no backend by default: none registered runs every layout; give "
        "--backends\n")


# ----------------------------------------------------------------------------- the plan

def test_a_device_sweep_runs_every_workload_backend_and_count_in_that_order():
    args = _args("--gpus", "4,1", "--backends", "torch_dp,torch_ddp", "--workloads", "mlm,cnn", "--grad-accum", "2")
    assert sweep_plan(args) == [("mlm", "torch_dp", 1, None, 2), ("mlm", "torch_dp", 4, None, 2),
                                ("mlm", "torch_ddp", 1, None, 2), ("mlm", "torch_ddp", 4, None, 2),
                                ("cnn", "torch_dp", 1, None, 2), ("cnn", "torch_dp", 4, None, 2),
                                ("cnn", "torch_ddp", 1, None, 2), ("cnn", "torch_ddp", 4, None, 2)]


def test_a_layout_sweep_multiplies_the_grad_accum_of_the_references_only():
    args = _args("--layouts", "pp2-nmb2,dp2", "--backends", "torch_3d", "--workloads", "mlm", "--grad-accum", "3")
    args.devices = None
    plan = sweep_plan(args)
    assert [(w, b, n, lay.name, accum) for w, b, n, lay, accum in plan] == [
        ("mlm", "torch_3d", 1, "1 device", 3), ("mlm", "torch_3d", 1, "1 device", 6),
        ("mlm", "torch_3d", 2, "pp2-nmb2", 3), ("mlm", "torch_3d", 2, "dp2", 3)]


def test_repeats_interleave_the_rows_every_other_repeat_reversed():
    assert repeat_order(3, 1) == [(0, 0), (0, 1), (0, 2)]
    assert repeat_order(3, 3) == [(0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (1, 0), (2, 0), (2, 1), (2, 2)]
    assert repeat_order(2, 0) == []


def test_the_co_run_probe_takes_each_backend_and_workload_s_first_one_device_row():
    plan = [("cnn", "a", 2, None, 1), ("cnn", "a", 1, None, 1), ("cnn", "a", 1, None, 4), ("cnn", "b", 1, None, 1),
            ("mlm", "a", 2, None, 1), ("mlm", "a", 1, None, 1)]
    order = repeat_order(len(plan), 2)
    assert probed_runs(plan, order) == {(0, 1), (0, 3), (0, 5), (1, 1), (1, 3), (1, 5)}
    assert probed_runs(plan, [(0, 2), (0, 0)]) == set()  # only the rows the order runs
    assert probed_runs([("cnn", "a", 2, None, 1)], [(0, 0)]) == set()


# ----------------------------------------------------------------------------- bench.run's command lines

RUN_DEFAULTS = ["--data", "auto", "--seed", "0", "--out", "results", "--model-size", "tiny", "--precision", "fp32",
                "--grad-accum", "1", "--eval-every", "0", "--eval-samples", "0", "--patience", "0",
                "--checkpoint-every", "0", "--device-kind", "auto", "--breakdown-steps", "0", "--profile", "0",
                "--timeout", "3600.0", "--collective-timeout", "300.0"]
LAYOUT_DEFAULTS = ["--fsdp", "1", "--model-parallel", "1", "--pipeline-stages", "1", "--context-parallel", "1",
                   "--micro-batches", "1", "--micro-batch-size", "0", "--pipeline-schedule", "gpipe",
                   "--virtual-stages", "1", "--recompute", "none", "--stage-split", "even"]


def test_each_run_gets_the_sweep_s_options_and_only_its_own_backend_s():
    args = _args("--steps", "7", "--max-restarts", "2", "--tf-mode", "multi_worker")
    head = ["--workload", "cnn", "--devices", "2", "--run-id", "RID", "--sweep-id", "SID"]
    assert _tail(run_command(args, "torch_ddp", "cnn", 2, "RID", "SID")) == \
        ["--backend", "torch_ddp", *head, "--steps", "7", *RUN_DEFAULTS, *LAYOUT_DEFAULTS, "--max-restarts", "2"]
    assert _tail(run_command(args, "tf_mirrored", "cnn", 2, "RID", "SID")) == \
        ["--backend", "tf_mirrored", *head, "--steps", "7", *RUN_DEFAULTS, *LAYOUT_DEFAULTS, "--tf-mode",
         "multi_worker"]
    # main() sets the sweep's own command line, which every record carries.
    args.sweep_command = "python -m bench.compare --steps 7"
    assert _tail(run_command(args, "torch_dp", "cnn", 1, "RID", "SID"))[:14] == \
        ["--backend", "torch_dp", "--workload", "cnn", "--devices", "1", "--run-id", "RID", "--sweep-id", "SID",
         "--sweep-command", "python -m bench.compare --steps 7", "--steps", "7"]


def test_a_layout_run_gets_its_layout_s_flags_and_accumulation_instead_of_the_sweep_s():
    args = _args("--layouts", "tp2", "--backends", "torch_3d", "--grad-accum", "2")
    cmd = _tail(run_command(args, "torch_3d", "mlm", 2, "RID", "SID", parse_layout("tp2-rc"), 4))
    run_defaults = [t for t in RUN_DEFAULTS if t != "--grad-accum"]
    run_defaults.remove("1")  # grad-accum's value, the first "1" of the defaults
    assert cmd == ["--backend", "torch_3d", "--workload", "mlm", "--devices", "2", "--run-id", "RID", "--sweep-id",
                   "SID", *run_defaults, "--grad-accum", "4", "--model-parallel", "2", "--recompute", "full"]


def test_bench_run_s_checks_say_which_runs_are_bad_input_by_their_index():
    args = _args("--gpus", "1,2,3", "--workloads", "cnn", "--scaling", "strong", "--batch-size", "4")
    bad = bad_input(args, sweep_plan(args), "SID")
    assert list(bad) == [2] and isinstance(bad[2], BadInput)
    assert str(bad[2]) == "--scaling strong: global batch 4 is not divisible by 3 data-parallel replicas x 1 " \
        "micro-batches"


def test_the_checks_see_each_layout_run_s_own_accumulation():
    """--grad-accum 3 in a layout sweep: pp2-nmb2 runs at 3 (its 1-device reference at 6), which bench.run refuses
    for a pipeline (its micro-batches already accumulate), so that run, and only it, is bad input."""
    args = _args("--layouts", "pp2-nmb2", "--backends", "torch_3d", "--workloads", "cnn", "--grad-accum", "3")
    args.devices = None
    plan = sweep_plan(args)
    assert [(lay.name, accum) for *_, lay, accum in plan] == [("1 device", 6), ("pp2-nmb2", 3)]
    assert {i: str(exc) for i, exc in bad_input(args, plan, "SID").items()} == {
        1: "--grad-accum 3 with 2 pipeline stages: the pipeline's --micro-batches already accumulate"}


def test_under_srun_the_checks_count_every_node_of_the_job():
    # 2 nodes: 1 device a node is a world of 2, 2 devices a node one of 4 (batch 6 divides the first only).
    args = _args("--gpus", "1,2", "--workloads", "cnn", "--scaling", "strong", "--batch-size", "6", srun=True,
                 job_nodes=2)
    bad = bad_input(args, sweep_plan(args), "SID")
    assert list(bad) == [1]
    assert str(bad[1]) == "--scaling strong: global batch 6 is not divisible by 4 data-parallel replicas x 1 " \
        "micro-batches"
    args.srun = False  # the nodes count only under --srun
    assert bad_input(args, sweep_plan(args), "SID") == {}


# ----------------------------------------------------------------------------- what the sweep records itself

def _fit() -> FitCheck:
    return FitCheck(predicted_per_rank=[3 * 2**30], available_bytes=2**30, limit="--memory-per-device 1 GiB",
                    verdict="does not fit", counts="state + activations")


def test_a_run_that_left_no_record_gets_the_sweep_s_own(tmp_path):
    args = _args("--scaling", "strong", "--seed", "5", "--data", "synthetic", "--out", str(tmp_path),
                 sweep_command="python -m bench.compare --seed 5")
    record_harness_failure(args, "torch_ddp", "cnn", 2, "r-plain", "SID", "failed", "it died")
    record_harness_failure(args, "torch_3d", "mlm", 2, "r-layout", "SID", "invalid", "no fit",
                           parse_layout("tp2"), 4, _fit())
    plain, layout = (json.loads((tmp_path / "runs" / f"{r}.json").read_text()) for r in ("r-plain", "r-layout"))
    assert {k: plain.get(k) for k in ("run_id", "backend", "workload", "devices", "sweep_id", "sweep_command",
                                      "scaling", "seed", "data", "status", "error", "duration_s", "layout", "config",
                                      "fit_check")} == {
        "run_id": "r-plain", "backend": "torch_ddp", "workload": "cnn", "devices": 2, "sweep_id": "SID",
        "sweep_command": "python -m bench.compare --seed 5", "scaling": "strong", "seed": 5, "data": "synthetic",
        "status": "failed", "error": "it died", "duration_s": 0.0, "layout": None, "config": {}, "fit_check": None}
    assert (layout["status"], layout["error"], layout["config"], layout["layout"]["tp"], layout["layout"]["dp"],
            layout["layout"]["recompute"]) == ("invalid", "no fit", {"grad_accum": 4}, 2, 1, "none")
    assert layout["fit_check"] == {"predicted_per_rank": [3 * 2**30], "available_bytes": 2**30,
                                   "limit": "--memory-per-device 1 GiB", "verdict": "does not fit",
                                   "counts": "state + activations", "error": None}


class StandIn:
    """bench.run's side of a launch: the command bench.compare gave it, and what the run did: an exit code, its
    log, and a record written or not."""

    def __init__(self, rc: int | None = 0, log: str = "", record: bool = False):
        self.rc, self.log, self.record, self.commands = rc, log, record, []

    def __call__(self, args, cmd, log: Path, run_id: str, result: Path):
        self.commands.append(cmd)
        log.write_text(self.log)
        if self.record:
            result.parent.mkdir(parents=True, exist_ok=True)
            result.write_text(json.dumps({"run_id": run_id, "status": "ok"}))
        return self.rc


def _one(tmp_path, monkeypatch, stand_in: StandIn, *extra, layout=None, srun_nodes=0, invalid=None) -> dict | str:
    monkeypatch.setattr(compare, "launch", stand_in)
    args = _args("--out", str(tmp_path))
    logs = tmp_path / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    run_id = run_one(args, "torch_ddp", "cnn", 2, "SID", logs, layout, 3 if layout else 1, invalid, srun_nodes)
    path = tmp_path / "runs" / f"{run_id}.json"
    return json.loads(path.read_text())


def test_a_run_bench_run_recorded_is_left_as_it_wrote_it(tmp_path, monkeypatch):
    stand_in = StandIn(rc=1, record=True)
    assert _one(tmp_path, monkeypatch, stand_in) == {"run_id": load_records(tmp_path)[0]["run_id"], "status": "ok"}
    run_id = load_records(tmp_path)[0]["run_id"]
    assert run_id.split("-")[1:4] == ["torch_ddp", "cnn", "n2"]
    cmd = _tail(stand_in.commands[0])
    assert cmd[cmd.index("--run-id") + 1] == run_id and cmd[cmd.index("--devices") + 1] == "2"


def test_bench_run_s_refusal_is_an_invalid_run_with_its_one_line(tmp_path, monkeypatch):
    log = "starting\nbench.run: error: first\nnoise\nbench.run: error: 2 devices do not divide it\nsrun: done\n"
    record = _one(tmp_path, monkeypatch, StandIn(rc=2, log=log))
    assert (record["status"], record["error"], record["devices"], record["backend"], record["workload"],
            record["sweep_id"]) == ("invalid", "invalid for 2 device(s): 2 devices do not divide it", 2, "torch_ddp",
                                    "cnn", "SID")
    record = _one(tmp_path / "l", monkeypatch, StandIn(rc=2, log=log), layout=parse_layout("tp2"))
    assert (record["status"], record["error"], record["config"]) == \
        ("invalid", "invalid for layout tp2: 2 devices do not divide it", {"grad_accum": 3})


@pytest.mark.parametrize("rc, says", [(None, "harness timed out"), (1, "bench.run exited 1 without a record"),
                                      (-9, "bench.run exited -9 without a record")])
def test_a_run_that_died_without_a_record_is_failed_with_its_log_s_tail(tmp_path, monkeypatch, rc, says):
    record = _one(tmp_path, monkeypatch, StandIn(rc=rc, log="loading\n\nbench.run: error: x\nKilled\n"),
                  layout=parse_layout("dp2"))
    assert (record["status"], record["error"]) == ("failed", f"{says}: loading | bench.run: error: x | Killed")
    assert (record["backend"], record["sweep_id"]) == ("torch_ddp", "SID")
    assert record["layout"]["dp"] == 2 and record["config"] == {"grad_accum": 3}


def test_a_run_invalid_for_its_devices_alone_is_recorded_without_launching(tmp_path, monkeypatch):
    stand_in = StandIn()
    record = _one(tmp_path, monkeypatch, stand_in, invalid=BadInput("batch 3 over 2"))
    assert (record["status"], record["error"], record.get("fit_check")) == \
        ("invalid", "invalid for 2 device(s): batch 3 over 2", None)
    record = _one(tmp_path / "l", monkeypatch, stand_in, layout=parse_layout("pp2-nmb2"),
                  invalid=DoesNotFit("does not fit", _fit()))
    assert (record["status"], record["error"], record["config"]) == \
        ("invalid", "invalid for layout pp2-nmb2: does not fit", {"grad_accum": 3})
    assert record["fit_check"]["predicted_per_rank"] == [3 * 2**30] and record["fit_check"]["verdict"] == \
        "does not fit"
    assert stand_in.commands == [] and not list((tmp_path / "logs").iterdir())


def test_under_srun_a_run_is_a_job_step_over_the_nodes_and_counts_their_devices(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "8")
    stand_in = StandIn(rc=1, log="x\n")
    record = _one(tmp_path, monkeypatch, stand_in, srun_nodes=3)
    assert stand_in.commands[0][:6] == ["srun", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1",
                                        "--kill-on-bad-exit=0", "--cpus-per-task=8"]
    cmd = _tail(stand_in.commands[0][6:])
    assert cmd[cmd.index("--devices") + 1] == "2"  # per node
    assert record["devices"] == 6 and record["run_id"].split("-")[3] == "n6"
    assert record["error"] == "bench.run exited 1 without a record: x"
    assert (tmp_path / "logs" / f"{record['run_id']}.log").read_text() == "x\n"
    record = _one(tmp_path / "i", monkeypatch, stand_in, srun_nodes=3, invalid=BadInput("no"))
    assert (record["devices"], record["run_id"].split("-")[3]) == (6, "n6")


def test_the_refusal_is_bench_run_s_last_error_line_else_the_log_s_last(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("bench.run: error: a\nbench.run: error: b: c\nsrun: error: task 1 exited\n")
    assert refusal(log) == "b: c"
    log.write_text("Traceback\nValueError: bench.run: error: not at the start\n\n")
    assert refusal(log) == "ValueError: bench.run: error: not at the start"
    assert refusal(tmp_path / "missing.log") == "(no log)"
    # the last of three error lines; a byte that is no UTF-8 (a worker's binary output) read as a replacement
    log.write_bytes(b"\xff\xfe worker\nbench.run: error: a\nbench.run: error: b\nbench.run: error: c \xff\n")
    assert refusal(log) == "c \ufffd"


def test_a_run_s_defaults_are_one_accumulation_and_no_srun(tmp_path, monkeypatch):
    """run_command, record_harness_failure and run_one called without an accumulation or nodes: one step each,
    no job step; a sweep without a command line of its own records an empty one."""
    args = _args("--out", str(tmp_path))
    cmd = _tail(run_command(args, "torch_3d", "mlm", 2, "r", "SID", parse_layout("tp2")))
    assert cmd[cmd.index("--grad-accum") + 1] == "1"
    vars(args).pop("sweep_command", None)   # a caller of its own, not main(), sets none
    record_harness_failure(args, "torch_3d", "mlm", 2, "r-layout", "SID", "failed", "died", parse_layout("tp2"))
    record = json.loads((tmp_path / "runs" / "r-layout.json").read_text())
    assert (record["config"], record["sweep_command"]) == ({"grad_accum": 1}, "")
    stand_in = StandIn(rc=1, log="x\n")
    monkeypatch.setattr(compare, "launch", stand_in)
    (tmp_path / "logs").mkdir()
    run_id = run_one(args, "torch_3d", "mlm", 2, "SID", tmp_path / "logs", parse_layout("tp2"))
    record = json.loads((tmp_path / "runs" / f"{run_id}.json").read_text())
    assert stand_in.commands[0][:3] == [sys.executable, "-m", "bench.run"]   # not an srun job step
    assert (record["backend"], record["sweep_id"], record["config"]) == ("torch_3d", "SID", {"grad_accum": 1})


# ----------------------------------------------------------------------------- launching and stopping

def _sh(script: str) -> list[str]:
    """A stand-in for bench.run that is no Python process (the fast tests start none)."""
    return ["sh", "-c", script]


def test_a_launch_returns_the_exit_code_with_the_output_in_the_log(tmp_path):
    log = tmp_path / "r.log"
    # stdin is closed (read gets nothing), stdout and stderr both go to the log
    rc = launch(Namespace(timeout=60.0), _sh("echo out; echo err >&2; read x || exit 3; exit 4"), log, "r",
                tmp_path / "r.json")
    assert rc == 3 and log.read_text() == "out\nerr\n"
    assert launch(Namespace(timeout=60.0), _sh("exit 0"), log, "r", tmp_path / "r.json") == 0
    assert log.read_text() == ""
    # --timeout 0.1 s allows 0.1 s + the harness's margin: a run of 0.2 s is not cut short
    assert launch(Namespace(timeout=0.1), _sh("sleep 0.2; exit 5"), log, "r", tmp_path / "r.json") == 5


def test_a_launched_run_reads_no_terminal_and_imports_this_repo(tmp_path, monkeypatch):
    """bench.run's stdin is /dev/null even where the sweep's is a terminal or a pipe (a worker waiting on input would
    hang the sweep): here the sweep's fd 0 is a pipe with a line in it, which the run must not read. Its
    environment is child_env's: the repo first on PYTHONPATH."""
    from common.launch import REPO_ROOT
    monkeypatch.delenv("PYTHONPATH", raising=False)
    log = tmp_path / "r.log"
    read_end, write_end = os.pipe()
    os.write(write_end, b"typed\n")
    os.close(write_end)
    saved = os.dup(0)
    os.dup2(read_end, 0)
    try:
        rc = launch(Namespace(timeout=60.0), _sh('echo "$PYTHONPATH"; read x && echo "read $x"; exit 0'), log, "r",
                    tmp_path / "r.json")
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(read_end)
    assert rc == 0 and log.read_text() == f"{REPO_ROOT}\n"


def test_a_run_past_its_timeout_is_stopped_and_reads_as_none(tmp_path):
    log = tmp_path / "r.log"
    started = time.monotonic()
    args = Namespace(timeout=0.5 - HARNESS_MARGIN_S)  # the margin is bench.run's own start-up, on top
    assert launch(args, _sh("echo up; exec sleep 60"), log, "r", tmp_path / "x") is None
    assert time.monotonic() - started < 10 and log.read_text() == "up\n"


def _launch_cancelled(tmp_path, script: str) -> SweepCancelled:
    """Run `script` as run r (log r.log, record r.json) under the sweep's signal handlers; the script signals the
    sweep, which stops it. The handlers the test had are put back."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    cancel_on_signals()
    try:
        with pytest.raises(SweepCancelled) as exc:
            launch(Namespace(timeout=60.0), _sh(script), tmp_path / "r.log", "r", tmp_path / "r.json")
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return exc.value


def _cancelling(tmp_path, record: bool):
    """A run that writes (or not) its record, then sends the sweep SIGTERM and waits to be stopped."""
    script = (f"echo {{}} > {tmp_path / 'r.json'}; " if record else "") + "sleep 0.3; kill -TERM $PPID; exec sleep 60"
    return _launch_cancelled(tmp_path, script)


def test_a_signal_to_the_sweep_stops_the_run_and_says_whether_it_wrote_its_record(tmp_path):
    started = time.monotonic()
    cut = _cancelling(tmp_path, record=False)
    assert (cut.run_id, cut.record_written, cut.cancelled.signum) == ("r", False, signal.SIGTERM)
    assert not (tmp_path / "r.log").exists()  # no record, no log
    done = _cancelling(tmp_path, record=True)
    assert (done.run_id, done.record_written) == ("r", True) and (tmp_path / "r.log").exists()
    assert time.monotonic() - started < 10  # stopped by the signal passed on, not by the timeout


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_run_passes_the_signal_on(sig):
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    stop_run(proc, sig) if sig != signal.SIGTERM else stop_run(proc)
    assert proc.returncode == -sig
    stop_run(proc)  # a process already gone is no error


def test_a_run_that_outlives_its_grace_after_the_signal_is_killed_with_its_group(monkeypatch, tmp_path):
    """TERM_GRACE_S + 10 s after the signal (here 0.5 s): a run still in its handler 1 s later is SIGKILLed, group
    and all; a run whose handler exits at once keeps its own exit code."""
    monkeypatch.setattr(compare, "TERM_GRACE_S", -9.5)
    ready = [tmp_path / "slow", tmp_path / "quick"]
    slow = subprocess.Popen(_sh(f"trap 'kill $!; sleep 1; exit 7' TERM; touch {ready[0]}; sleep 30 & wait"),
                            start_new_session=True)
    quick = subprocess.Popen(_sh(f"trap 'kill $!; exit 7' TERM; touch {ready[1]}; sleep 30 & wait"),
                             start_new_session=True)
    deadline = time.monotonic() + 30
    while not all(p.exists() for p in ready) and time.monotonic() < deadline:   # both traps set
        time.sleep(0.01)
    stop_run(slow)
    stop_run(quick)
    assert (slow.returncode, quick.returncode) == (-signal.SIGKILL, 7)


def test_stop_run_takes_a_run_gone_between_its_steps_as_stopped(monkeypatch):
    """The run may end (and its group with it) between the poll and the signal, or between the timeout and the
    SIGKILL: the ProcessLookupError that follows is no error."""
    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait()

    def gone(*_):
        raise ProcessLookupError

    monkeypatch.setattr(proc, "send_signal", gone)
    stop_run(proc)

    class Lingering:   # still running at the timeout; its group gone by the SIGKILL
        pid, waits = proc.pid, []

        def send_signal(self, sig):
            pass

        def wait(self, timeout=None):
            self.waits.append(timeout)
            if timeout is not None:
                raise subprocess.TimeoutExpired("bench.run", timeout)
            return -9
    monkeypatch.setattr(compare.os, "killpg", gone)
    lingering = Lingering()
    stop_run(lingering)
    assert lingering.waits == [compare.TERM_GRACE_S + 10, None]


def test_the_sweep_passes_on_the_signal_it_got_and_forgets_a_log_already_gone(tmp_path):
    """SIGINT to the sweep reaches the run as SIGINT (not the default TERM); a run that took its own log away
    before it was stopped leaves the sweep nothing to remove, which is no error. SweepCancelled says its run."""
    got, log = tmp_path / "got", tmp_path / "r.log"
    script = (f"trap 'kill $!; echo INT > {got}; exit 0' INT; trap 'kill $!; echo TERM > {got}; exit 0' TERM; "
              f"rm {log}; "
              "sleep 0.3; kill -INT $PPID; sleep 30 & wait")
    cut = _launch_cancelled(tmp_path, script)
    assert got.read_text() == "INT\n" and not log.exists()
    assert (str(cut), cut.cancelled.signum) == ("r", signal.SIGINT)


# ----------------------------------------------------------------------------- what it prints

def _rows(text: str) -> list[list[str]]:
    """The table's cells, row by row (the header first), from rich's drawing; a cell wrapped over lines is joined
    again (a row's first cell, its workload, is never empty)."""
    rows, edge = [], None
    for line in text.splitlines():
        if line[:1] not in ("│", "┃"):
            edge = None
            continue
        cells = [cell.strip() for cell in line[1:-1].split(line[0])]
        if edge == line[0] and (line[0] == "┃" or not cells[0]):
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
        else:
            rows.append(cells)
        edge = line[0]
    return rows


def _sides(text: str, row: int) -> str:
    """Where each cell of a table's row sits: L flush left, R flush right, = filling its column."""
    line = [ln for ln in text.splitlines() if ln[:1] in ("│", "┃")][row]
    return "".join("=" if cell == f" {cell.strip()} " else "L" if cell.rstrip() == f" {cell.strip()}" else "R"
                   for cell in line[1:-1].split(line[0]))


def _console() -> Console:
    return Console(record=True, width=400, file=io.StringIO())


def _summary_row(**over) -> dict:
    row = {"workload": "cnn", "backend": "torch_ddp", "devices": 2, "device_kind": "cpu", "oversubscribed": False,
           "threads_per_device": 1.5, "virtual": True, "data": "real", "status": "ok", "samples_per_s": 1234.56,
           "scaling_efficiency": 0.876, "mfu": 0.0123, "mfu_achievable": 0.25, "step_time_p50": 0.123456,
           "data_wait_fraction": 0.05, "eval_value": 0.98765, "error": None}
    return row | over


def test_the_sweep_table_says_what_each_device_count_counted_and_why_a_run_failed():
    frame = pd.DataFrame([
        _summary_row(),
        _summary_row(devices=4, oversubscribed=True, threads_per_device=2.0, data=None, samples_per_s=None,
                     scaling_efficiency=float("nan"), mfu=None, mfu_achievable=None, step_time_p50=None,
                     data_wait_fraction=None, eval_value=None, status="failed", error="[file.cc:537] died"),
        _summary_row(backend="torch_dp", devices=8, device_kind="cuda", virtual=False, status="ok",
                     error="ignored while ok"),
        _summary_row(backend="tf_mirrored", devices=2, device_kind="gpu", virtual=True),
        _summary_row(backend="mindspore_auto", devices=3, device_kind=None, status="invalid", error="bad N",
                     data="synthetic"),
    ])
    frame["data"] = pd.Series(["real", None, "real", "real", "synthetic"], dtype=object)  # a record without it
    console = _console()
    print_table(console, frame)
    text = console.export_text()
    assert text.split("\n")[0].strip() == "parbench sweep"
    rows = _rows(text)
    assert rows[0] == ["workload", "backend", "devices", "data", "status", "samples/s", "efficiency", "MFU",
                       "MFU (measured peak)", "step p50 (s)", "data wait", "eval", "note"]
    assert rows[1] == ["cnn", "torch_ddp", "2 cpu (virtual, 1.5 thr)", "real", "ok", "1234.6", "0.88", "1.2%",
                       "25.0%", "0.1235", "5.0%", "0.9877", ""]
    # names to the left, figures to the right ("=": the cell fills its column)
    assert [_sides(text, i) for i in range(3)] == ["=LLLL==R===RL", "LLLLLRR=RRR=R", "LL=LLRRRRRRR="]
    assert rows[2] == ["cnn", "torch_ddp", "4 cpu (virtual, 2 thr, oversubscribed)", "?", "failed", "", "", "", "",
                       "", "", "", "[file.cc:537] died"]
    assert rows[3][2:5] == ["8 cuda", "real", "ok"] and rows[3][-1] == ""
    assert rows[4][2] == "2 gpu (virtual)"
    assert rows[5][2:5] == ["3", "synthetic", "invalid"] and rows[5][-1] == "bad N"


def test_a_table_cell_is_empty_for_a_missing_or_nan_figure():
    assert compare._fmt(None, "{:.1f}") == "" and compare._fmt(float("nan"), "{:.1f}") == ""
    assert compare._fmt(0.0, "{:.1f}") == "0.0" and compare._fmt(0.5, "{:.0%}") == "50%"


def _layout_record(index: int, layout: str | None, grad_accum: int, sps: float | None, status: str = "ok",
                   error: str | None = None) -> dict:
    lay = parse_layout(layout) if layout else Layout()
    return skeleton(f"2026112307{index:02d}-torch_3d-mlm-n{lay.devices}", "torch_3d", "mlm", lay.devices,
                    f"2026-11-23T07:{index:02d}:00+00:00", sweep_id="layouts-20261123T070000Z-abcdef", data="real",
                    scaling="strong", device_kind="cpu", virtual=True, threads_per_device=1, layout=asdict(lay),
                    config={"grad_accum": grad_accum}, global_batch=8, status=status, samples_per_s=sps, error=error)


def test_the_layout_table_names_each_layout_with_its_efficiency_against_its_one_device_run():
    records = [_layout_record(0, None, 1, 40.0), _layout_record(1, None, 4, 32.0),
               _layout_record(2, "dp2", 1, 60.0, error="ignored while ok"),
               _layout_record(3, "pp2-nmb4-1f1b", 1, 48.0),
               _layout_record(4, "tp2-vocab", 1, None, "unsupported",
                              "--vocab-split: torch_3d does not split the embedding's vocabulary yet"),
               _layout_record(5, "dp2xtp2", 1, None, "failed", "worker rank 3 exited with signal 9"),
               _layout_record(6, "dp16", 1, None, "invalid", "16 devices: not here")]
    console = _console()
    print_layout_table(console, records)
    text = console.export_text()
    assert text.split("\n")[0].strip() == "parbench layouts (one global batch)"
    # dp2 at 60 samples/s against 40 on 1 device: 60 / (2 x 40) = 0.75; the pipeline's 4 micro-batches against the
    # 1-device run accumulating 4: 48 / (2 x 32) = 0.75.
    assert _rows(text) == [
        ["workload", "backend", "layout", "N", "status", "samples/s", "efficiency vs 1 device", "note"],
        ["mlm", "torch_3d", "1 device", "1", "ok", "40.0", "1.00", ""],
        ["mlm", "torch_3d", "1 device, 4 micro-batches", "1", "ok", "32.0", "1.00", ""],
        ["mlm", "torch_3d", "dp2", "2", "ok", "60.0", "0.75", ""],
        ["mlm", "torch_3d", "pp2-nmb4-1f1b", "2", "ok", "48.0", "0.75", ""],
        ["mlm", "torch_3d", "tp2-vocab", "2", "unsupported", "", "",
         "--vocab-split: torch_3d does not split the embedding's vocabulary yet"],
        ["mlm", "torch_3d", "dp2xtp2", "4", "failed", "", "", "worker rank 3 exited with signal 9"],
        ["mlm", "torch_3d", "dp16", "16", "invalid", "", "", "16 devices: not here"]]
    assert [_sides(text, i) for i in range(2)] == ["=LLRL==L", "L=LRLRRR"]


def _interval(backend: str, devices: int, sps: tuple[float, float, float], eff=(None, None, None), busy=0,
              layout="") -> dict:
    return {"workload": "cnn", "backend": backend, "layout": layout, "devices": devices, "runs": 3,
            "busy_runs": busy, "samples_per_s": sps[0], "samples_per_s_low": sps[1], "samples_per_s_high": sps[2],
            "efficiency": eff[0], "efficiency_low": eff[1], "efficiency_high": eff[2]}


def test_the_interval_table_ranks_within_a_device_count_and_calls_an_overlap_no_difference():
    frame = pd.DataFrame([
        _interval("torch_dp", 2, (50.0, 48.0, 52.0), (0.5, 0.45, 0.55)),
        _interval("torch_ddp", 2, (100.04, 95.0, 105.0), (0.96, 0.9, 1.04), busy=2, layout="dp2"),
        _interval("tf_mirrored", 2, (98.0, 90.0, 101.0), (0.95, 0.91, 0.99)),
        _interval("torch_ddp", 1, (52.0, 51.0, 53.0), (1.0, 1.0, 1.0)),
        _interval("torch_dp", 1, (49.0, 48.0, 50.0), (float("nan"), None, None)),
    ])
    console = _console()
    print_interval_table(console, frame)
    text = console.export_text()
    assert text.split("\n")[0].strip() == \
        "parbench repeats: median and 95% interval (two-level bootstrap over runs and steps)"
    assert _rows(text) == [
        ["workload", "backend", "layout", "N", "runs", "samples/s [95% interval]", "efficiency [95% interval]",
         "vs fastest of its N", "busy runs"],
        ["cnn", "torch_ddp", "", "1", "3", "52.0 [51.0, 53.0]", "1.00 [1.00, 1.00]", "fastest", ""],
        ["cnn", "torch_dp", "", "1", "3", "49.0 [48.0, 50.0]", "", "0.94x", ""],
        ["cnn", "torch_ddp", "dp2", "2", "3", "100.0 [95.0, 105.0]", "0.96 [0.90, 1.04]", "fastest", "2"],
        ["cnn", "tf_mirrored", "", "2", "3", "98.0 [90.0, 101.0]", "0.95 [0.91, 0.99]", "no difference", ""],
        ["cnn", "torch_dp", "", "2", "3", "50.0 [48.0, 52.0]", "0.50 [0.45, 0.55]", "0.50x", ""]]
    assert [_sides(text, i) for i in (0, 3)] == ["=L=======", "LLL=RRRLR"]


def test_a_cancelled_sweep_says_what_it_cut_and_what_it_kept(tmp_path):
    console = _console()
    assert cancelled(Cancelled(signal.SIGINT), tmp_path, ["a", "b"], 5, console) == 130
    assert cancelled(SweepCancelled(Cancelled(signal.SIGTERM), "c", False), tmp_path, ["a"], 4, console) == 143
    assert cancelled(SweepCancelled(Cancelled(signal.SIGTERM), "c", True), tmp_path, ["a"], 4, console) == 143
    assert _flat(console.export_text()).split(" bench.compare: ") == [
        f"bench.compare: cancelled by SIGINT: no run was in progress; 3 of 5 runs not done; kept 2 record(s) of "
        f"finished runs in {tmp_path / 'runs'}",
        f"cancelled by SIGTERM: run c stopped with its workers, no record written; 3 of 4 runs not done; kept 1 "
        f"record(s) of finished runs in {tmp_path / 'runs'}",
        f"cancelled by SIGTERM: no run was in progress; 2 of 4 runs not done; kept 2 record(s) of finished runs in "
        f"{tmp_path / 'runs'}"]
    assert (tmp_path / "summary.csv").is_file()


def test_the_cancelled_line_is_one_line_on_a_narrow_terminal(tmp_path):
    console = Console(record=True, width=40, file=io.StringIO())
    cancelled(Cancelled(signal.SIGINT), tmp_path, [], 3, console)
    assert console.export_text().count("\n") == 1


def test_a_run_is_started_in_a_session_of_its_own(tmp_path):
    # a terminal's Ctrl-C reaches only the sweep, which passes it on (launch)
    log = tmp_path / "r.log"
    assert launch(Namespace(timeout=60.0), _sh("ps -o sid= -p $$"), log, "r", tmp_path / "r.json") == 0
    assert int(log.read_text()) != os.getsid(0)


def test_a_sweep_cancelled_before_any_run_finished_writes_no_summary(tmp_path):
    console = _console()
    assert cancelled(SweepCancelled(Cancelled(signal.SIGINT), "c", False), tmp_path, [], 2, console) == 130
    assert "2 of 2 runs not done; kept 0 record(s)" in _flat(console.export_text())
    assert not (tmp_path / "summary.csv").exists()


# ----------------------------------------------------------------------------- the co-run probe

def _reference(out: Path, run_id: str = "r1", **over) -> Path:
    record = {"run_id": run_id, "status": "ok", "device_kind": "cpu", "host": {"cores": 4}, "threads_per_device": 1,
              "step_time_s": {"p50": 0.1}} | over
    path = out / "runs" / f"{run_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


class Probe:
    """bench.co_run.probe's side: what bench.compare asked of it, and the section it measured (None: a copy
    failed)."""

    def __init__(self, section: CoRun | None):
        self.section, self.calls = section, []

    def __call__(self, reference, k, command, out, timeout_s, stop):
        self.calls.append({"reference": reference["run_id"], "k": k, "command": command(Path("FOLDER")), "out": out,
                           "timeout_s": timeout_s, "stop": stop})
        return self.section


PLAN = [("cnn", "torch_ddp", 1, None, 1), ("cnn", "torch_ddp", 3, None, 1), ("cnn", "torch_ddp", 8, None, 1),
        ("cnn", "torch_dp", 16, None, 1), ("mlm", "torch_ddp", 16, None, 1)]


def test_the_probe_runs_the_one_device_run_again_as_the_sweep_s_largest_count_the_cores_hold(tmp_path, monkeypatch):
    from bench import co_run

    path = _reference(tmp_path, host={"cores": 12}, threads_per_device=2, step_time_s={"p50": 0.6})
    probe = Probe(CoRun(processes=6, step_s_p50=[0.8, 1.0, 0.9, 1.2, 1.5, 0.7], slowdown=1.4,
                        run_ids=[f"c{i}" for i in range(6)]))
    monkeypatch.setattr(co_run, "probe", probe)
    args = _args("--out", str(tmp_path), "--steps", "9")
    console = _console()
    compare.co_run_probe(args, PLAN, "torch_ddp", "cnn", "SID", None, 1, "r1", console)
    # 12 cores / 2 threads = 6 copies: fewer than the 8 devices of the sweep's largest cnn torch_ddp run
    call = probe.calls[0]
    assert (call["reference"], call["k"], call["out"], call["timeout_s"], call["stop"]) == \
        ("r1", 6, tmp_path, 3600.0 + HARNESS_MARGIN_S, stop_run)
    cmd = _tail(call["command"])
    copy = cmd[cmd.index("--run-id") + 1]
    assert copy.split("-")[1:4] == ["torch_ddp", "cnn", "n1"] and copy != "r1"
    assert cmd[:10] == ["--backend", "torch_ddp", "--workload", "cnn", "--devices", "1", "--run-id", copy,
                        "--sweep-id", "SID"]
    assert cmd[cmd.index("--steps") + 1] == "9"
    assert cmd[-7:] == ["--out", "FOLDER", "--skip-eval", "--profile", "0", "--breakdown-steps", "0"]
    # the median of the six medians, (0.9 + 1.0) / 2 = 950 ms, against 600 ms alone
    assert _flat(console.export_text()) == \
        "co-run probe of r1: 6 copies side by side took a median 950 ms a step against 600 ms alone: x1.400"
    record = json.loads(path.read_text())
    assert record["co_run"] == {"processes": 6, "step_s_p50": [0.8, 1.0, 0.9, 1.2, 1.5, 0.7], "slowdown": 1.4,
                                "run_ids": ["c0", "c1", "c2", "c3", "c4", "c5"]}
    assert record["status"] == "ok" and record["step_time_s"] == {"p50": 0.6}


def test_the_probe_of_a_layout_reference_runs_its_accumulation(tmp_path, monkeypatch):
    from bench import co_run

    _reference(tmp_path)
    probe = Probe(None)
    monkeypatch.setattr(co_run, "probe", probe)
    args = _args("--layouts", "pp2-nmb4", "--backends", "torch_3d", "--out", str(tmp_path))
    plan = [("mlm", "torch_3d", 1, parse_layout("pp2-nmb4"), 4), ("mlm", "torch_3d", 2, parse_layout("pp2-nmb4"), 1)]
    console = _console()
    compare.co_run_probe(args, plan, "torch_3d", "mlm", "SID", plan[0][3], 4, "r1", console)
    cmd = _tail(probe.calls[0]["command"])
    assert probe.calls[0]["k"] == 2  # 4 cores, 1 thread each, the sweep's 2 devices
    assert cmd[cmd.index("--grad-accum") + 1] == "4" and cmd[cmd.index("--pipeline-stages") + 1] == "2"
    # a copy failed: nothing said here (co_run said why), the record as it was
    assert console.export_text() == "" and "co_run" not in json.loads((tmp_path / "runs" / "r1.json").read_text())


@pytest.mark.parametrize("over", [{"status": "failed"}, {"device_kind": "cuda"}, {"device_kind": None}],
                         ids=["failed", "gpu", "unknown device"])
def test_only_an_ok_cpu_run_is_probed(tmp_path, monkeypatch, over):
    from bench import co_run

    _reference(tmp_path, **over)
    probe = Probe(None)
    monkeypatch.setattr(co_run, "probe", probe)
    console = _console()
    compare.co_run_probe(_args("--out", str(tmp_path)), PLAN, "torch_ddp", "cnn", "SID", None, 1, "r1", console)
    compare.co_run_probe(_args("--out", str(tmp_path)), PLAN, "torch_ddp", "cnn", "SID", None, 1, "none", console)
    assert probe.calls == [] and console.export_text() == ""


@pytest.mark.parametrize("host, threads", [({"cores": 3}, 2), ({"cores": None}, 1), (None, 1)])
def test_a_probe_that_fits_fewer_than_two_copies_is_not_measured(tmp_path, monkeypatch, host, threads):
    from bench import co_run

    _reference(tmp_path, host=host, threads_per_device=threads)
    probe = Probe(None)
    monkeypatch.setattr(co_run, "probe", probe)
    console = _console()
    compare.co_run_probe(_args("--out", str(tmp_path)), PLAN, "torch_ddp", "cnn", "SID", None, 1, "r1", console)
    assert probe.calls == []
    assert _flat(console.export_text()) == "co-run probe of r1: fewer than two processes fit the cores; not measured"


# ----------------------------------------------------------------------------- a whole sweep

class BenchRun:
    """bench.run's part in a sweep: each command it is given, run as a record bench.run could have written (a CPU
    run of the global batch 4 at 40 samples/s on 1 device, 60 on 2, data parallel), or, for the devices in
    `fail`, a death without one."""

    def __init__(self, fail: tuple[int, ...] = (), layout: bool = False):
        self.commands, self.fail, self.layout = [], fail, layout

    @staticmethod
    def options(cmd: list[str]) -> dict[str, str]:
        start = cmd.index("bench.run") + 1  # after srun's own options, if any
        return dict(zip(cmd[start::2], cmd[start + 1::2]))

    def __call__(self, args, cmd, log: Path, run_id: str, result: Path):
        self.commands.append(cmd)
        opt = self.options(cmd)
        devices = int(opt["--devices"])
        log.write_text(f"bench.run {run_id}\n")
        if devices in self.fail:
            return 1
        sps = {1: 40.0, 2: 60.0}[devices]
        record = skeleton(run_id, opt["--backend"], opt["--workload"], devices,
                          f"2026-01-01T00:00:{len(self.commands):02d}+00:00", sweep_id=opt["--sweep-id"],
                          sweep_command=opt["--sweep-command"], data="synthetic", scaling="strong", seed=0,
                          strategy="DDP", framework="torch", framework_version="2", device_kind="cpu", virtual=True,
                          threads_per_device=2, global_batch=4, per_device_batch=4 // devices,
                          config={"grad_accum": int(opt["--grad-accum"])}, host={"name": "h", "cores": 8})
        record.update(status="ok", measured_steps=3, samples_per_s=sps, step_times_s=[4 / sps] * 3,
                      step_time_s=dict.fromkeys(("mean", "p50", "p90", "min", "max"), 4 / sps) | {"std": 0.0},
                      data_wait_fraction=0.01, duration_s=1.0, params=1000, flops_per_sample=6000,
                      tokens_per_s=sps * 128 if opt["--workload"] == "mlm" else None)
        if self.layout:
            record["layout"] = asdict(Layout(pp=2, micro_batches=2) if "--pipeline-stages" in opt
                                      else Layout(dp=devices))
        write_record(record, Path(args.out))
        return 0


def test_a_sweep_runs_its_plan_records_a_bad_run_once_and_prints_its_tables(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # the lines on stderr unwrapped (the tables have their own width)
    stand_in = BenchRun()
    monkeypatch.setattr(compare, "launch", stand_in)
    out = tmp_path / "out"
    argv = ["--gpus", "1,2,3", "--backends", "torch_ddp", "--workloads", "cnn", "--scaling", "strong",
            "--batch-size", "4", "--repeats", "2", "--threads-per-device", "2", "--device-kind", "cpu",
            "--out", str(out)]
    code, stdout, stderr = run_in_process("bench.compare", *argv)
    assert code == 0, stderr
    records = sorted(load_records(out), key=lambda r: r["started_at"])
    sweep_id = records[0]["sweep_id"]
    # 3 rows x 2 repeats, the second in reverse; batch 4 over 3 devices is bad input, recorded once and not run
    assert [int(dict(zip(c[3::2], c[4::2]))["--devices"]) for c in stand_in.commands] == [1, 2, 2, 1]
    assert sweep_id.startswith("sweep-") and {r["sweep_id"] for r in records} == {sweep_id}
    assert all(dict(zip(c[3::2], c[4::2]))["--threads-per-device"] == "2" for c in stand_in.commands)
    assert {r["sweep_command"] for r in records} == {"python -m bench.compare " + " ".join(argv)}
    bad = [r for r in records if r["status"] != "ok"]
    assert [(r["devices"], r["status"], r["error"]) for r in bad] == [
        (3, "invalid", "invalid for 3 device(s): --scaling strong: global batch 4 is not divisible by 3 "
                       "data-parallel replicas x 1 micro-batches")]
    assert sorted(p.name for p in (out / "logs" / sweep_id).iterdir()) == \
        sorted(f"{r['run_id']}.log" for r in records if r["status"] == "ok")
    # off a terminal the tables are drawn 160 columns wide, whatever the terminal's width says (COLUMNS)
    assert max(len(line) for line in stdout.splitlines()) == 160
    tables = _rows(stdout)
    # the sweep table, one row a run: 60 samples/s on 2 devices against 40 on 1 is 60 / (2 x 40) = 0.75
    assert [row[:7] for row in tables[:6]] == [
        ["workload", "backend", "devices", "data", "status", "samples/s", "efficiency"],
        ["cnn", "torch_ddp", "1 cpu (virtual, 2 thr)", "synthetic", "ok", "40.0", "1.00"],
        ["cnn", "torch_ddp", "2 cpu (virtual, 2 thr)", "synthetic", "ok", "60.0", "0.75"],
        ["cnn", "torch_ddp", "2 cpu (virtual, 2 thr)", "synthetic", "ok", "60.0", "0.75"],
        ["cnn", "torch_ddp", "1 cpu (virtual, 2 thr)", "synthetic", "ok", "40.0", "1.00"],
        ["cnn", "torch_ddp", "3", "auto", "invalid", "", ""]]  # what the sweep was asked for: its record
    # then each row's median over its repeats, every step the same: no width to the intervals
    assert tables[6:] == [
        ["workload", "backend", "layout", "N", "runs", "samples/s [95% interval]", "efficiency [95% interval]",
         "vs fastest of its N", "busy runs"],
        ["cnn", "torch_ddp", "", "1", "2", "40.0 [40.0, 40.0]", "1.00 [1.00, 1.00]", "fastest", ""],
        ["cnn", "torch_ddp", "", "2", "2", "60.0 [60.0, 60.0]", "0.75 [0.75, 0.75]", "fastest", ""]]
    intervals = pd.read_csv(out / f"intervals-{sweep_id}.csv")
    assert list(intervals.devices) == [1, 2] and list(intervals.runs) == [2, 2]
    assert list(intervals.columns) == list(compare.interval_frame(records).columns)   # no index column
    assert len(pd.read_csv(out / "summary.csv")) == 5
    said = _flat(stderr)
    assert said.startswith(f"{sweep_id}: 6 runs (3 rows x 2 repeats), 2 thread(s) per virtual CPU device ")
    # the progress bar at its end: the last run, a bar, runs done of all, the time taken
    assert re.search(r" torch_ddp cnn N=1, repeat 2/2 ━+ 6/6 0:00:0\d ", said), said
    assert said.endswith(f" 5 runs in 0 s; records in {out / 'runs'}, summary {out / 'summary.csv'}, intervals "
                         f"{out / f'intervals-{sweep_id}.csv'}")


def test_a_one_repeat_sweep_prints_no_intervals_and_records_a_dead_run_as_failed(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # the lines on stderr unwrapped: a long tmp_path would break inside a path
    stand_in = BenchRun(fail=(2,))
    monkeypatch.setattr(compare, "launch", stand_in)
    out = tmp_path / "out"
    monkeypatch.setattr(compare, "default_threads_per_device", lambda n: {2: 3}[n])  # cores / the largest count
    probe = Probe(CoRun(processes=2, step_s_p50=[0.11, 0.13], slowdown=1.2, run_ids=["c0", "c1"]))
    from bench import co_run
    monkeypatch.setattr(co_run, "probe", probe)
    code, stdout, stderr = run_in_process("bench.compare", "--gpus", "1,2", "--backends", "torch_ddp,torch_dp",
                                          "--workloads", "cnn", "--device-kind", "cpu", "--co-run-probe",
                                          "--out", str(out))
    assert code == 0, stderr
    # each backend's 1-device run, again as 2 processes (8 cores / 2 threads, at most the sweep's 2 devices)
    ones = {r["backend"]: r["run_id"] for r in load_records(out) if r["devices"] == 1}
    assert [(c["reference"], c["k"]) for c in probe.calls] == [(ones["torch_ddp"], 2), (ones["torch_dp"], 2)]
    assert [BenchRun.options(c["command"])["--backend"] for c in probe.calls] == ["torch_ddp", "torch_dp"]
    assert all(c["command"][-7:-5] == ["--out", "FOLDER"] and c["stop"] is stop_run for c in probe.calls)
    assert {BenchRun.options(c["command"])["--sweep-id"] for c in probe.calls} == {load_records(out)[0]["sweep_id"]}
    assert f"co-run probe of {ones['torch_dp']}: 2 copies side by side took a median 120 ms a step against 100 ms " \
        "alone: x1.200" in _flat(stderr)
    assert [(dict(zip(c[3::2], c[4::2]))["--backend"], dict(zip(c[3::2], c[4::2]))["--devices"],
             dict(zip(c[3::2], c[4::2]))["--threads-per-device"]) for c in stand_in.commands] == [
        ("torch_ddp", "1", "3"), ("torch_ddp", "2", "3"), ("torch_dp", "1", "3"), ("torch_dp", "2", "3")]
    failed = sorted((r["backend"], r["status"], r["error"]) for r in load_records(out) if r["status"] != "ok")
    assert [(b, s) for b, s, _ in failed] == [("torch_ddp", "failed"), ("torch_dp", "failed")]
    assert all(e.startswith("bench.run exited 1 without a record: bench.run ") for _, _, e in failed)
    assert "parbench repeats" not in stdout and not list(out.glob("intervals-*.csv"))
    assert len(_rows(stdout)) == 5
    said = _flat(stderr)
    sweep_id = load_records(out)[0]["sweep_id"]
    assert said.startswith(f"{sweep_id}: 4 runs, 3 thread(s) per virtual CPU device ")
    assert " torch_dp cnn N=2 " in said
    assert said.endswith(f" 4 runs in 0 s; records in {out / 'runs'}, summary {out / 'summary.csv'}")


class _FrozenClock:
    """datetime for bench.compare at 2026-01-01 12:00:00 UTC, on a machine whose local time is 5 hours behind."""

    @staticmethod
    def now(tz=None):
        from datetime import datetime, timedelta, timezone
        utc = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
        return utc.astimezone(tz) if tz else (utc - timedelta(hours=5)).replace(tzinfo=None)


def test_a_sweep_without_gpus_or_backends_runs_one_and_two_devices_of_every_backend(tmp_path, monkeypatch):
    """No --gpus: 1 and 2 devices; no --backends: every registered backend. The sweep id is the UTC second it
    started and 6 hex digits; its log folder may be there already (a sweep id taken again), and on a terminal the
    tables take the terminal's width (COLUMNS), not 160 columns."""
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.setattr(compare, "backend_names", lambda: ["torch_ddp", "torch_dp"])
    monkeypatch.setattr(compare, "datetime", _FrozenClock)
    monkeypatch.setattr(compare.secrets, "token_hex", lambda n: "ab" * n)
    stand_in = BenchRun()
    monkeypatch.setattr(compare, "launch", stand_in)
    out = tmp_path / "out"
    (out / "logs" / "sweep-20260101T120000Z-ababab").mkdir(parents=True)
    real_stdout = sys.stdout

    class _Terminal(io.StringIO):
        def isatty(self):
            return True
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    code = compare.main(["--workloads", "cnn", "--device-kind", "cpu", "--threads-per-device", "1", "--out",
                         str(out)])
    monkeypatch.setattr(sys, "stdout", real_stdout)
    assert code == 0
    assert [(BenchRun.options(c)["--backend"], BenchRun.options(c)["--devices"]) for c in stand_in.commands] == [
        ("torch_ddp", "1"), ("torch_ddp", "2"), ("torch_dp", "1"), ("torch_dp", "2")]
    assert {r["sweep_id"] for r in load_records(out)} == {"sweep-20260101T120000Z-ababab"}
    drawn = re.sub(r"\x1b\[[0-9;]*m", "", terminal.getvalue())   # a terminal's tables come with their colours
    assert max(len(line) for line in drawn.splitlines()) == 120


def test_a_layout_sweep_runs_each_layout_with_its_flags_and_prints_the_layout_table(tmp_path, monkeypatch):
    stand_in = BenchRun(layout=True)
    monkeypatch.setattr(compare, "launch", stand_in)
    out = tmp_path / "out"
    code, stdout, stderr = run_in_process("bench.compare", "--layouts", "dp2,pp2-nmb2", "--backends", "torch_3d",
                                          "--workloads", "mlm", "--batch-size", "4", "--threads-per-device", "1",
                                          "--device-kind", "cpu", "--out", str(out))
    assert code == 0, stderr
    sweep_id = load_records(out)[0]["sweep_id"]
    assert sweep_id.startswith("layouts-")
    runs = [BenchRun.options(c) for c in stand_in.commands]
    assert [(o["--devices"], o["--grad-accum"], o.get("--pipeline-stages"), o.get("--micro-batches"), o["--scaling"])
            for o in runs] == [("1", "1", None, None, "strong"), ("1", "2", None, None, "strong"),
                               ("2", "1", None, None, "strong"), ("2", "1", "2", "2", "strong")]
    assert _rows(stdout)[0] == ["workload", "backend", "layout", "N", "status", "samples/s",
                                "efficiency vs 1 device", "note"]
    # 60 samples/s on 2 devices against 40 on 1 (the pipeline's reference accumulating its 2 micro-batches)
    assert [row[2:7] for row in _rows(stdout)[1:]] == [["1 device", "1", "ok", "40.0", "1.00"],
                                                      ["1 device, 2 micro-batches", "1", "ok", "40.0", "1.00"],
                                                      ["dp2", "2", "ok", "60.0", "0.75"],
                                                      ["pp2-nmb2", "2", "ok", "60.0", "0.75"]]
    assert f"{sweep_id}: 4 runs, 1 thread(s) per virtual CPU device torch_3d mlm pp2-nmb2 (N=2, accumulating 1) " \
        in _flat(stderr)


def test_a_layout_sweep_probes_its_reference_with_the_reference_s_own_accumulation(tmp_path, monkeypatch):
    """--layouts pp2-nmb2 --grad-accum 3: the only 1-device reference accumulates 2 x 3 = 6 micro-batches, and the
    co-run probe runs that command again (not the sweep's own --grad-accum 3)."""
    stand_in = BenchRun(layout=True)
    monkeypatch.setattr(compare, "launch", stand_in)
    probe = Probe(None)
    from bench import co_run
    monkeypatch.setattr(co_run, "probe", probe)
    out = tmp_path / "out"
    code, _, stderr = run_in_process("bench.compare", "--layouts", "pp2-nmb2", "--backends", "torch_3d",
                                     "--workloads", "mlm", "--grad-accum", "3", "--batch-size", "12",
                                     "--threads-per-device", "2", "--device-kind", "cpu", "--co-run-probe",
                                     "--out", str(out))
    assert code == 0, stderr
    [call] = probe.calls
    assert BenchRun.options(call["command"])["--grad-accum"] == "6"
    assert BenchRun.options(stand_in.commands[0])["--grad-accum"] == "6"


def test_a_sweep_under_srun_runs_job_steps_and_records_its_own_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    monkeypatch.delenv("SLURM_CPUS_ON_NODE", raising=False)
    argv = ["--gpus", "1", "--backends", "torch_ddp", "--workloads", "cnn", "--srun", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", ["bench/compare.py", *argv])  # as `python -m bench.compare` leaves it
    stand_in = BenchRun()
    monkeypatch.setattr(compare, "launch", stand_in)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert compare.main() == 0
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert [c[:5] for c in stand_in.commands] == [["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                                                   "--kill-on-bad-exit=0"]]
    assert BenchRun.options(stand_in.commands[0])["--sweep-command"] == "python -m bench.compare " + " ".join(argv)
    assert load_records(tmp_path)[0]["run_id"].split("-")[3] == "n2"  # the world: 2 nodes x 1 device


class Cancelling(BenchRun):
    """bench.run's part until the signal: the run numbered `at` is stopped by it (launch raises SweepCancelled,
    its record written or not)."""

    def __init__(self, at: int, written: bool):
        super().__init__()
        self.at, self.written = at, written

    def __call__(self, args, cmd, log, run_id, result):
        if len(self.commands) == self.at:
            self.commands.append(cmd)
            raise SweepCancelled(Cancelled(signal.SIGTERM), run_id, self.written)
        return super().__call__(args, cmd, log, run_id, result)


def test_a_sweep_cut_by_a_signal_keeps_the_finished_runs_and_exits_128_plus_the_signal(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")
    stand_in = Cancelling(at=1, written=False)
    monkeypatch.setattr(compare, "launch", stand_in)
    out = tmp_path / "out"
    code, stdout, stderr = run_in_process("bench.compare", "--gpus", "1,2", "--backends", "torch_ddp",
                                          "--workloads", "cnn", "--threads-per-device", "1", "--device-kind", "cpu",
                                          "--out", str(out))
    assert code == 143 and stdout == ""
    cut = BenchRun.options(stand_in.commands[1])["--run-id"]
    assert _flat(stderr).endswith(f" bench.compare: cancelled by SIGTERM: run {cut} stopped with its workers, no "
                                  f"record written; 1 of 2 runs not done; kept 1 record(s) of finished runs in "
                                  f"{out / 'runs'}")
    assert len(pd.read_csv(out / "summary.csv")) == 1 and len(load_records(out)) == 1
