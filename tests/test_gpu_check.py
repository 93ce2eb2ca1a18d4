"""bench.gpu_check, the device check prepared for a lent GPU, run on a CPU: the same code (a tiny model, a few steps),
every run of its groups ok beside its framework's bare loop and profiled, and the summary's ratios those of the
records. The CPU run holds two groups (the MLM's three backends, the CNN's two, bench.calibrate's bare loops of both
torch backends and of keras_jax); every group's command, the compiled one's (inductor takes minutes on this CPU) and
the decoder's (one more minute of the suite) among them, is held to the checks bench.run makes before a framework
loads."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from backends import load_backend
from bench import calibrate, compare, gpu_check
from bench import run as bench_run
from tests.conftest import run_cli


def test_the_compiled_group_is_the_eager_one_under_torch_compile():
    args = gpu_check.build_parser().parse_args(["--out", "x"])
    eager, compiled = (gpu_check.calibrate_command(args, g) for g in ("mlm", "mlm-compiled"))
    assert compiled[compiled.index("--backends") + 1] == "torch_ddp" and compiled[-1] == "--compile"
    without = [a for a in compiled if a != "--compile"]
    assert without[:without.index("--backends")] == eager[:eager.index("--backends")]
    assert eager[eager.index("--precision") + 1] == "amp" and eager[eager.index("--batch-size") + 1] == "256"
    assert eager[eager.index("--model-size") + 1] == "base" and "--profile" in eager and "--data" in eager
    record = {"backend": "torch_ddp", "workload": "mlm", "config": {"compile": "default"}}
    assert gpu_check.group_of(record) == "mlm-compiled"
    assert gpu_check.group_of({**record, "backend": "keras_jax"}) == "mlm"   # XLA compiles every keras_jax step


@pytest.mark.parametrize("group", list(gpu_check.GROUPS))
def test_every_group_s_runs_pass_bench_run_s_checks(group, tmp_path):
    """Each group's bench.calibrate command at the check's defaults (the base models, the GPU's batches) and every
    bench.run it launches: its backends and workload as GROUPS says, each run through the checks bench.run makes
    before it launches (on this CPU: the backend's own, as the e2e run below meets them)."""
    args = gpu_check.build_parser().parse_args(["--out", str(tmp_path), "--device-kind", "cpu"])
    command = gpu_check.calibrate_command(args, group)
    assert command[1:3] == ["-m", "bench.calibrate"]
    sweep = calibrate.build_parser().parse_args(command[3:])
    workload, backends, flags = gpu_check.GROUPS[group]
    assert (sweep.backends, sweep.workloads, sweep.devices) == (list(backends), [workload], [1])
    assert sweep.profile == args.profile and bool(sweep.compile) == ("--compile" in flags)
    parser = bench_run.build_parser()
    for backend in backends:
        run = compare.run_command(sweep, backend, workload, 1, "check", "sweep")
        options = parser.parse_args(run[3:])
        checked = bench_run.check_run(options, fit=False)
        runner = load_backend(backend)
        plan = runner.plan_devices(1, "cpu", 1)
        bench_run.check_supported(backend, runner, bench_run.build_config(options, "check", plan, checked), plan)
        assert checked.data == "synthetic" and checked.per_device_batch == {
            "mlm": args.batch_size, "cnn": args.cnn_batch_size, "lm": args.lm_batch_size}[workload]


@pytest.mark.e2e
def test_the_device_check_runs_on_a_cpu(tmp_path):
    out = tmp_path / "check"
    # bf16 autocast is emulated on this CPU (a tiny MLM step of 4 sequences 1.2 s in torch): the least batches
    proc = run_cli("bench.gpu_check", "--out", str(out), "--groups", "mlm,cnn", "--device-kind", "cpu",
                   "--model-size", "tiny", "--batch-size", "2", "--cnn-batch-size", "8",
                   "--steps", "3", "--warmup-steps", "1", "--profile", "1", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "gpu-check.json").read_text())
    rows = {(r["group"], r["backend"]): r for r in summary["rows"]}
    assert set(rows) == {("mlm", "torch_3d"), ("mlm", "torch_ddp"), ("mlm", "keras_jax"), ("cnn", "torch_ddp"),
                         ("cnn", "torch_dp")}
    assert summary["failed_groups"] == []
    for (group, backend), row in rows.items():
        record = json.loads((out / "runs" / f"{row['run_id']}.json").read_text())
        assert record["config"]["precision"] == "amp" and record["device_kind"] == "cpu"
        assert (record.get("backend_metrics") or {}).get("attribution"), (backend, "not profiled")
        # its framework's bare loop: its own, or for torch_3d (none of its own) torch_ddp's of the same group
        loop = "torch_ddp" if backend == "torch_3d" else backend
        bare = json.loads((out / "runs" / f"{rows[(group, loop)]['run_id']}.json").read_text())["calibration"]
        assert row["bare_loop"] == loop and row["bare_ratio"] == pytest.approx(
            record["samples_per_s"] / bare["bare_samples_per_s"])
        # bench.calibrate's record: its ratio and the idiom it was held to; the breakdown's probe steps (3 by
        # default) after the measured window, which holds the 2 steps after the warm-up
        calibration = record.get("calibration")
        if backend == "torch_3d":
            assert calibration is None  # held to torch_ddp's above
        else:
            assert calibration["ratio"] > 0 and calibration["repeats"] == 1
            assert backend.split("_")[0] in calibration["idiom"].lower(), calibration["idiom"]
        breakdown = record["backend_metrics"]["breakdown"]
        assert breakdown["probe_steps"] == 3 and breakdown["forward_backward_s"] > 0
        assert record["measured_steps"] == 2
        assert row["step_s"] == record["step_time_s"]["p50"] and row["mfu"] == record["mfu"]
        torch_3d = rows.get((group, "torch_3d"))
        expected = row["step_s"] / torch_3d["step_s"] if torch_3d else None
        assert row["step_over_torch_3d"] == (pytest.approx(expected) if expected else None)
    # one bare loop per framework and group (mlm: torch_ddp's, keras_jax's; cnn: torch_ddp's, torch_dp's), none of
    # torch_3d's own
    assert len(list((out / "bare").glob("*.json"))) == 4
    assert "Where the step goes" in (out / "report.md").read_text()
    table = (out / "gpu-check.md").read_text()
    assert table.count("| mlm |") == 3 and table.count("| cnn |") == 2


def test_each_row_gets_the_clocks_nvidia_smi_sampled_while_its_run_ran():
    """Runs one after another on one GPU compare fairly only at the same clocks: each row shows the median SM clock
    and power of the trace's samples from its run's start to its end, and '-' where none fell inside."""
    base = datetime(2026, 11, 29, 10, 0, 0, tzinfo=timezone.utc)
    records = [{"run_id": "a", "started_at": base.isoformat(), "duration_s": 10.0},
               {"run_id": "b", "started_at": (base + timedelta(seconds=20)).isoformat(), "duration_s": 10.0},
               {"run_id": "c", "started_at": (base + timedelta(seconds=60)).isoformat(), "duration_s": 5.0}]
    t0 = base.timestamp()
    trace = [(t0 + 1, 1980.0, 600.0), (t0 + 5, 1900.0, 690.0), (t0 + 9, 1950.0, 650.0),    # a
             (t0 + 15, 345.0, 80.0),                                                       # between runs: no one's
             (t0 + 21, 1700.0, 700.0), (t0 + 29, 1750.0, 700.0)]                           # b
    rows = [{"run_id": k, "group": "mlm", "backend": k, "step_s": 0.1, "samples_per_s": 10.0, "mfu": None,
             "bare_ratio": None, "step_over_torch_3d": None, "device": "GPU"} for k in "abc"]
    held = {r["run_id"]: (r["sm_clock_mhz"], r["power_w"]) for r in gpu_check.with_clocks(rows, records, trace)}
    assert held == {"a": (1950.0, 650.0), "b": (1725.0, 700.0), "c": (None, None)}
    table = gpu_check.markdown(gpu_check.with_clocks(rows, records, trace), [], "name, power.limit [W]\nH200, 700 W\n")
    assert "| mlm | a | 100.0 | 10.0 | - | - | - | 1,950 | 650 |" in table
    assert "| mlm | c | 100.0 | 10.0 | - | - | - | - | - |" in table
    assert table.endswith("```\nname, power.limit [W]\nH200, 700 W\n```\n")
    assert "nvidia-smi: not on this machine" in gpu_check.markdown(rows, [])
