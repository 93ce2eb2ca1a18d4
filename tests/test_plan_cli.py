"""bench.plan's command line, its --run and bench.plan_check, in-process and without a framework: the options and
what they change in the plan, the table printed, the JSON written, the bench.compare command built (the
subprocess that would run it is replaced by one that writes the records a sweep would), the measured points
attached, the exhaustive check's lines and verdicts."""
from __future__ import annotations

import copy
import importlib
import io
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from backends import BACKENDS
from bench import plan as plan_cli
from bench import plan_check, plan_run, plan_space
from bench.reporting.plan import COLUMNS
from common.config import RunConfig
from common.devices import DevicePlan, cpu_cores
from common.layout import Layout
from common.plan.space import enumerate_layouts
from common.predict import decoder
from common.predict import hardware as hardware_files
from common.spec import BERT_SIZES, model_spec

GIB = 2**30
CPU = hardware_files.load("cpu-loopback-2core")
# A real record (torch_3d, BERT-base, fp32, one H100, batch 32), made here into the records of a CPU sweep.
REFERENCE = next((Path(__file__).resolve().parents[1] / "results" / "reference" / "h100x1" / "runs")
                 .glob("*-71a4f0.json"))
KERAS_PIPELINE = "--pipeline-stages 2: keras.distribution has no pipeline parallelism"


def _load_backend(name: str):
    entry = BACKENDS[name]
    return getattr(importlib.import_module(entry.module), entry.cls)()


@pytest.fixture(autouse=True)
def backends_without_frameworks(monkeypatch):
    """A plan asks a backend's parent-side check (backends/<name>/backend.py, which imports no framework);
    load_backend refuses a backend whose framework is not installed (the mutation session installs none), so
    the backend's class is built here as load_backend builds it, its check unchanged."""
    monkeypatch.setattr(plan_space, "load_backend", _load_backend)


def _record(run_id: str, name: str = "", step_s: float = 0.1, peak: float = 5e8, size: str = "tiny",
            started: str = "2026-11-25T00:00:00+00:00", status: str = "ok", load: dict | None = None,
            backend: str = "torch_3d", batch: int = 32, steps: int = 20) -> dict:
    """A run of layout `name` ("": one device) on the development VM, every step `step_s`."""
    r = copy.deepcopy(json.loads(REFERENCE.read_text()))
    lay = Layout.parse(name) if name else Layout()
    r.update(run_id=run_id, backend=backend, device_kind="cpu", devices=lay.devices, status=status,
             started_at=started, devices_description=f"{lay.devices} x cpu", global_batch=batch,
             per_device_batch=batch // lay.dp, layout=lay.as_record(BERT_SIZES[size], batch),
             step_times_s=[step_s] * steps, step_time_s={**r["step_time_s"], "p50": step_s}, threads_per_device=1,
             load=load or {})
    r["host"].update(gpus=[], cores=2)
    r["config"].update(device_kind="cpu", model_size=size, precision="fp32", devices=lay.devices, run_id=run_id,
                       backend=backend)
    r["memory"].update(process_peak_per_rank=[peak] * lay.devices, training_per_rank=[peak * 0.8] * lay.devices)
    del r["backend_metrics"]["state_bytes_per_rank"], r["backend_metrics"]["final_params"], r["loss"], r["notes"]
    if status != "ok":
        r["step_times_s"], r["step_time_s"] = [], None
    return r


def _folder(path: Path, *records: dict) -> Path:
    (path / "runs").mkdir(parents=True, exist_ok=True)
    for r in records:
        (path / "runs" / f"{r['run_id']}.json").write_text(json.dumps(r))
    return path


def _plan(capsys, *argv: str, tmp_path: Path) -> tuple[dict, str]:
    written = tmp_path / "plan.json"
    assert plan_cli.main([*argv, "--json", str(written)]) == 0
    return json.loads(written.read_text()), capsys.readouterr().out


def _flat(text: str) -> str:
    return " ".join(text.split())


# ----------------------------------------------------------------------------- bench.plan's options

def test_help_names_every_option_with_what_it_does(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps at hyphens too: one line per option
    with pytest.raises(SystemExit) as exit_:
        plan_cli.main(["--help"])
    text = _flat(capsys.readouterr().out)
    assert exit_.value.code == 0
    # The module's synopsis, then each option with its help as build_parser gives it; the bundled hardware
    # descriptions are the files of common/predict/hardware/.
    assert "python -m bench.plan --devices N [--hardware NAME|FILE] (--from RESULTS | --assume-mfu MFU) " \
        "[--workload W] [--model-size S] [--global-batch B] [--memory-per-device GIB] [--top K] " \
        "[--backend torch_3d|keras_jax] [--json FILE] [--run [--steps S] [--repeats R] [--out DIR]] " \
        "python -m bench.plan --model NAME|FILE --hardware GPU --devices N --global-batch B [--seq-len S] " \
        "[--stack STACK] [--memory-per-device GIB] [--top K] [--layout NAME] [--assume-mfu MFU] [--json FILE] " \
        "python -m bench.plan --published [--json FILE] options:" in text.replace("- mfu", "-mfu")  # wrapped there
    model_group, _, rest = text.partition(" --run: measure the top K")
    assert "--model: a decoder LLM on a GPU cluster (the decoders' model, a device compute table): --model NAME|FILE " \
        "a decoder LLM (" in model_group and all(m in model_group for m in decoder.available())
    for says in ("--seq-len SEQ_LEN the sequence length (default: the model file's)",
                 "or a TOML file of yours (common/predict/models/README.md) --stack {llm-foundry,llm-foundry-triton,"
                 "megatron-bridge-fp8-cs,megatron-te,olmo-core,olmo-core-float8,torch-compile,torch-compile-float8,"
                 "torch-eager} with --model: the software running the "
                 "step (kernels, fusions, tensor-parallel overlap, optimizer)",
                 "--layout NAME say where this layout stands (docs/layouts.md's grammar)",
                 "--published every published run's layout ranked in the plan for its model"):
        assert says in model_group, says
    text = model_group.split(" --model: a decoder LLM")[0] + " --run: measure the top K" + rest
    assert text.endswith(
        "--devices DEVICES devices to lay the model out on (>= 2) --hardware NAME|FILE a bundled description "
        "(a100-sxm-8, cpu-loopback-2core, h100-96gb-500w-8, h100-sxm-8, h200-sxm-8) or a TOML file of yours "
        "(common/predict/hardware/README.md); default cpu-loopback-2core --from RESULTS results folder whose "
        "1-device run on the --hardware's kind of device gives the compute --assume-mfu MFU compute at this "
        "fraction of the device's datasheet peak instead of a measured run (labelled as an assumption in every "
        "table and figure) --workload {cnn,mlm,lm} --model-size {base,mini,small,tiny} "
        "--global-batch GLOBAL_BATCH the global batch every layout trains (default: the workload's batch, 32 for "
        "the MLM) --micro-batches K,K pipeline micro-batch counts to consider (default: every count the batch "
        "divides into) --memory-per-device GIB memory one device may use (default: the hardware description's) "
        "--top TOP layouts to show (and to run with --run) --backend {torch_3d,keras_jax} --precision "
        "{fp32,amp,fp16} as bench.run's (default fp32) --skip-eval the runs do not evaluate: memory without the "
        "evaluation's logits (passed on with --run) --json FILE write the ranked list, with the measured points "
        "after --run --run: measure the top K with bench.compare (one global batch, strong scaling): --run run the "
        "top K and print predicted against measured --steps STEPS bench.run's --steps --warmup-steps WARMUP_STEPS "
        "bench.run's --warmup-steps --repeats REPEATS bench.compare's --repeats (intervals) --data "
        "{auto,real,synthetic} bench.run's --data --out OUT the sweep's results folder; the plan goes to "
        "OUT/plans/")


@pytest.mark.parametrize("args, says", [
    (["--devices", "1", "--assume-mfu", "0.4"], "--devices 1: a plan lays a model out over 2 or more devices"),
    (["--devices", "2"], "give --from RESULTS (a measured 1-device run) or --assume-mfu MFU"),
    (["--devices", "2", "--assume-mfu", "0.4", "--run"],
     "--run measures on this machine: plan from its records (--from RESULTS), not --assume-mfu"),
], ids=["one device", "no basis", "run an assumption"])
def test_bench_plan_s_own_refusals_word_for_word(args, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        plan_cli.main(args)
    assert exit_.value.code == 2 and capsys.readouterr().err == f"bench.plan: error: {says}\n"


def test_the_defaults_are_the_documented_ones():
    # docs/plan.md: the development VM, the tiny MLM, the top 5 on torch_3d in fp32, one repeat into results/.
    args = plan_cli.build_parser().parse_args(["--devices", "2", "--assume-mfu", "0.4"])
    assert (args.hardware, args.workload, args.model_size, args.top, args.backend, args.precision) == \
        ("cpu-loopback-2core", "mlm", "tiny", 5, "torch_3d", "fp32")
    assert (args.repeats, args.data, args.out, args.skip_eval, args.run, args.source, args.assume_mfu) == \
        (1, "auto", "results", False, False, None, 0.4)
    assert args.global_batch is args.micro_batches is args.memory_per_device is args.json is None
    assert args.steps is args.warmup_steps is None
    args = plan_cli.build_parser().parse_args(["--devices", "4", "--from", "r", "--micro-batches", "2,4",
                                               "--top", "3", "--run", "--skip-eval", "--steps", "7"])
    assert (args.source, args.micro_batches, args.top, args.run, args.skip_eval, args.steps) == \
        ("r", [2, 4], 3, True, True, 7)


@pytest.mark.parametrize("args, says", [
    (["--devices", "0", "--assume-mfu", "0.4"], "argument --devices: must be >= 1, got 0"),
    (["--assume-mfu", "0.4"], "the following arguments are required: --devices"),
    (["--devices", "2", "--assume-mfu", "0"], "argument --assume-mfu"),
    (["--devices", "2", "--assume-mfu", "0.4", "--backend", "torch_ddp"], "argument --backend: invalid choice"),
    (["--devices", "2", "--assume-mfu", "0.4", "--data", "fake"], "argument --data: invalid choice"),
    (["--devices", "2", "--assume-mfu", "0.4", "--top", "0"], "argument --top: must be >= 1"),
    (["--devices", "2", "--assume-mfu", "0.4", "--repeats", "0"], "argument --repeats: must be >= 1"),
    (["--devices", "2", "--assume-mfu", "0.4", "--steps", "0"], "argument --steps: must be >= 1"),
    (["--devices", "2", "--assume-mfu", "0.4", "--warmup-steps", "0"], "argument --warmup-steps: must be >= 1"),
    (["--devices", "2", "--assume-mfu", "0.4", "--global-batch", "0"], "argument --global-batch: must be >= 1"),
    (["--devices", "2", "--assume-mfu", "0.4", "--memory-per-device", "-1"], "argument --memory-per-device"),
    (["--devices", "2", "--assume-mfu", "0.4", "--micro-batches", "x"], "argument --micro-batches"),
    (["--devices", "2", "--assume-mfu", "0.4", "--model-size", "huge"], "argument --model-size: invalid choice"),
    (["--devices", "2", "--assume-mfu", "0.4", "--precision", "fp8"], "argument --precision: invalid choice"),
    (["--devices", "2", "--assume-mfu", "0.4", "--workload", "gpt"], "argument --workload: invalid choice"),
    # The development VM's file names no device, so no datasheet peak is known to assume a share of.
    (["--devices", "2", "--assume-mfu", "0.4"], "--assume-mfu: no fp32 peak is known for 'cpu-loopback-2core'"),
    (["--devices", "2", "--assume-mfu", "0.4", "--hardware", "nowhere"], "nowhere"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_options_are_one_line_and_exit_2(args, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        plan_cli.main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("bench.plan: error: ") and says in err, err


NEEDS = "--model needs --devices, --global-batch and --hardware (a GPU with a compute table)"


@pytest.mark.parametrize("args, says", [
    (["--assume-mfu", "0.4"], "the following arguments are required: --devices"),
    (["--devices", "2", "--assume-mfu", "0.4", "--layout", "dp2"],
     "--layout goes with --model (a decoder's plan); an executed workload's plan runs with --run"),
    (["--model", "llama3-8b", "--devices", "8"], NEEDS),
    (["--model", "llama3-8b", "--devices", "8", "--global-batch", "16"], NEEDS),   # the default hardware: a CPU
    (["--model", "llama3-8b", "--global-batch", "16", "--hardware", "h100-sxm-8"], NEEDS),
    (["--model", "llama3-8b", "--devices", "8", "--hardware", "h100-sxm-8"], NEEDS),
])
def test_a_refusal_of_what_goes_together_is_its_whole_line(args, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        plan_cli.main(args)
    assert (exit_.value.code, capsys.readouterr().err) == (2, f"bench.plan: error: {says}\n")


def test_an_assumed_mfu_plans_keras_jax_without_pipelines_and_writes_what_it_prints(tmp_path, capsys):
    plan, out = _plan(capsys, "--devices", "2", "--hardware", "h100-sxm-8", "--assume-mfu", "0.4",
                      "--backend", "keras_jax", tmp_path=tmp_path)
    # dp2 and fsdp2, tp2 with and without the vocabulary split, each with and without recompute: 8 layouts; the
    # pipelines, which keras_jax refuses, are among the refused candidates with its reason.
    assert plan["title"] == "mlm tiny on 2 x h100-sxm-8 (keras_jax), global batch 32"
    assert (plan["backend"], plan["devices"], plan["global_batch"], plan["hardware"], plan["precision"]) == \
        ("keras_jax", 2, 32, "h100-sxm-8", "fp32")
    assert {r["layout"] for r in plan["rows"]} == {"dp2", "dp2-rc", "fsdp2", "fsdp2-rc", "tp2", "tp2-rc",
                                                  "tp2-vocab", "tp2-rc-vocab"}
    assert plan["candidates"]["valid"] == 8 and any(KERAS_PIPELINE in why for why in plan["candidates"]["reasons"])
    assert plan["basis"].startswith("compute ASSUMED: MFU 0.4 of h100-sxm-8's fp32 datasheet peak")
    assert plan["basis"].endswith("(assumed)") and plan["ranking_error"] is None and plan["memory_error"] is None
    # 80 GiB an H100 (the hardware file), all of it the limit.
    assert plan["available_bytes"] == 80 * GIB and plan["memory_limit"] == "h100-sxm-8's memory"
    assert [r["rank"] for r in plan["rows"]] == list(range(1, 9)) and plan["pick"] == plan["rows"][0]["layout"]
    # The table: the title and basis, then the top 5 (the default --top) with the document's figures.
    lines = out.splitlines()
    assert max(len(line) for line in lines) == 200   # a wide console: 200 columns, wherever it prints
    assert lines[0].rstrip() == plan["title"] and lines[1].rstrip() == plan["basis"]
    body = [line for line in lines if line.startswith("│ ") and line[2] != " "]
    assert [line.split("│")[1].strip() for line in body] == ["1", "2", "3", "4", "5"]
    for line, row in zip(body, plan["rows"]):
        cells = [c.strip() for c in line.split("│")[1:-1]]
        step, parts = row["step_s"], row["parts_s"]
        assert cells[1:9] == [row["layout"], f"{step * 1e3:,.0f}", f"{row['samples_per_s']:,.1f}",
                              f"{row['memory_per_rank_max'] / GIB:,.2f}", row["fit"],
                              f"{parts['comm_exposed'] / step:.0%}", f"{parts['bubble'] / step:.0%}",
                              f"{parts['recompute'] / step:.0%}"]
        assert row["explanation"].startswith(cells[9])
    rc = next(line for line in body if line.split("│")[2].strip() == "dp2-rc")
    assert rc.split("│")[9].strip() != "0%"   # recompute's share of a step that recomputes
    assert out.rstrip().endswith(f"plan: {tmp_path / 'plan.json'}")
    flat = _flat(out)
    assert all(_flat(line) in flat for line in plan["summary"])


def test_top_batch_micro_batches_memory_and_eval_reach_the_plan(tmp_path, capsys):
    base = ["--devices", "2", "--hardware", "h100-sxm-8", "--assume-mfu", "0.4"]
    plan, out = _plan(capsys, *base, "--top", "2", "--global-batch", "16", "--micro-batches", "2",
                      "--memory-per-device", "0.5", "--skip-eval", tmp_path=tmp_path)
    assert plan["title"] == "mlm tiny on 2 x h100-sxm-8 (torch_3d), global batch 16" and plan["global_batch"] == 16
    assert plan["available_bytes"] == 0.5 * GIB and plan["memory_limit"] == "--memory-per-device 0.5 GiB"
    assert plan["skip_eval"] is True
    pipelines = [Layout.parse(r["layout"]) for r in plan["rows"] if Layout.parse(r["layout"]).pp > 1]
    assert pipelines and {lay.micro_batches for lay in pipelines} == {2}
    ranks = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│ ")]
    assert [r for r in ranks if r] == ["1", "2"]
    # Evaluation holds the logits of its batch: the same plan evaluating predicts more memory on some layout.
    evaluating, _ = _plan(capsys, *base, "--global-batch", "16", "--micro-batches", "2", tmp_path=tmp_path)
    assert evaluating["skip_eval"] is False and evaluating["available_bytes"] == 80 * GIB
    memory = {r["layout"]: r["memory_per_rank_max"] for r in evaluating["rows"]}
    assert any(memory[r["layout"]] > r["memory_per_rank_max"] for r in plan["rows"])
    # Under a limit halfway between the leanest and the fullest layout, those predicted over it (no memory error
    # known: point predictions) follow unranked, and unexplained: nothing to rank them against.
    half = (min(memory.values()) + max(memory.values())) / 2
    limited, _ = _plan(capsys, *base, "--global-batch", "16", "--micro-batches", "2", "--memory-per-device",
                       f"{half / GIB!r}", tmp_path=tmp_path)
    dropped = [r for r in limited["rows"] if r["memory_per_rank_max"] > half]
    assert dropped and all(r["rank"] == 0 and r["fit"] == "does not fit" and r["explanation"] == ""
                           for r in dropped)
    assert all(r["explanation"] for r in limited["rows"] if r["rank"])
    # The workload's batch (32 for the MLM) without --global-batch.
    default, _ = _plan(capsys, *base, "--micro-batches", "2", tmp_path=tmp_path)
    assert default["global_batch"] == 32


def _console_lines(show, *args) -> list[str]:
    from rich.console import Console
    console = Console(width=200, file=io.StringIO())
    show(console, *args)
    return console.file.getvalue().splitlines()


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.replace("┃", "│").split("│")[1:-1]]


def _table(lines: list[str]) -> tuple[list[str], list[list[str]]]:
    """A printed table's column names and rows, each cell's folded lines joined."""
    header = [_cells(line) for line in lines if line.startswith("┃")]
    columns = [" ".join(part for part in parts if part) for parts in zip(*header)]
    rows: list[list[str]] = []
    for cells in (_cells(line) for line in lines if line.startswith("│")):
        if cells[0] or not rows:
            rows.append(cells)
        else:
            rows[-1] = [" ".join(part for part in pair if part) for pair in zip(rows[-1], cells)]
    return columns, rows


def test_the_table_by_hand():
    row = {"rank": 1, "layout": "dp2", "step_s": 0.05, "samples_per_s": 640.0, "memory_per_rank_max": 1.5 * GIB,
           "fit": "fits", "parts_s": {"comm_exposed": 0.01, "bubble": 0.005, "recompute": 0.0},
           "explanation": "the [bold]pick[/bold]"}
    plan = {"title": "T [1]", "basis": "B [x]", "summary": ["one [red]line[/red]", "two"],
            "rows": [row, {**row, "rank": 2, "layout": "fsdp2", "step_s": 2.5, "memory_per_rank_max": 3 * GIB,
                           "explanation": "e2"},
                     {**row, "rank": 3, "layout": "tp2"}, {**row, "rank": 0, "layout": "pp2-nmb2"}]}
    lines = _console_lines(plan_cli.show, plan, 2)
    # Title and basis left-justified over the table (padded to its width), the header, then ranks 1 and 2 of
    # --top 2: 50 ms, 640.0 samples/s, 1.5 GiB, comm 0.01 / 0.05 = 20%, bubble 10%, recompute 0%.
    assert lines[0] == "T [1]".ljust(len(lines[2])) and lines[1] == "B [x]".ljust(len(lines[2]))
    columns, body = _table(lines)
    assert columns == ["#", "layout", "step (ms)", "samples/s", "memory/rank (GiB)", "fits", "exposed comm",
                       "bubble", "recompute", "what decides"]
    assert body == [["1", "dp2", "50", "640.0", "1.50", "fits", "20%", "10%", "0%", "the [bold]pick[/bold]"],
                    ["2", "fsdp2", "2,500", "640.0", "3.00", "fits", "0%", "0%", "0%", "e2"]]
    assert lines[-2:] == ["one [red]line[/red]", "two"]


def test_the_measured_table_by_hand():
    row = {"rank": 1, "layout": "dp2", "step_s": 0.05, "samples_per_s": 640.0, "memory_per_rank_max": 1.5 * GIB,
           "fit": "fits", "explanation": "[b]x[/b]",
           "measured": {"samples_per_s": 600.0, "low": 590.0, "high": 610.0, "rank": 1, "peak_per_rank_max": GIB}}
    plan = {"title": "T [1]", "rows": [row, {**row, "rank": 2, "layout": "tp2", "measured": None}],
            "measured": {"summary": "Measured: [fastest] dp2."}}
    lines = _console_lines(plan_run.show_measured, plan)
    assert lines[0] == "T [1]: predicted against measured".ljust(len(lines[1]))
    columns, body = _table(lines)
    # Only the measured rows, in the columns of bench.reporting.plan (what bench.report shows).
    assert columns == COLUMNS and body == [["1", "dp2", "50", "640.0", "600.0 [590.0, 610.0]", "1", "1.50", "1.00",
                                            "fits", "[b]x[/b]"]]
    assert lines[-1] == "Measured: [fastest] dp2."
    plan["measured"] = None
    assert _console_lines(plan_run.show_measured, plan)[-1].startswith("└")


def test_a_word_wider_than_its_column_is_folded_not_cut():
    from rich.console import Console
    word = "x" * 150
    row = {"rank": 1, "layout": "dp2", "step_s": 0.05, "samples_per_s": 640.0, "memory_per_rank_max": GIB,
           "fit": "fits", "parts_s": {"comm_exposed": 0.0, "bubble": 0.0, "recompute": 0.0}, "explanation": word,
           "measured": {"samples_per_s": 600.0, "peak_per_rank_max": None}}
    plan = {"title": "T", "basis": "B", "summary": [], "rows": [row], "measured": None}
    for show, args in ((plan_cli.show, (plan, 1)), (plan_run.show_measured, (plan,))):
        console = Console(width=100, file=io.StringIO())
        show(console, *args)
        _, body = _table(console.file.getvalue().splitlines())
        assert body[0][-1].replace(" ", "") == word


def test_the_size_and_the_workload_reach_the_plan(tmp_path, capsys):
    base = ["--devices", "2", "--hardware", "h100-sxm-8", "--assume-mfu", "0.4", "--micro-batches", "2,4,8"]
    # test_plan's count on 2 devices: dp, fsdp and fsdp-zero2, tp with and without the vocabulary split, each
    # with and without recompute (10), and 3 micro-batch counts x 2 schedules x (layers - 1) cuts x recompute.
    for size in ("tiny", "mini"):
        plan, _ = _plan(capsys, *base, "--model-size", size, tmp_path=tmp_path)
        assert len(plan["rows"]) == 10 + 3 * 2 * (BERT_SIZES[size].layers - 1) * 2, size
    # The CNN (its batch 64 a device by default) has no embedding table to split or keep whole.
    cnn, _ = _plan(capsys, *base, "--workload", "cnn", "--backend", "keras_jax", tmp_path=tmp_path)
    assert cnn["title"] == "cnn tiny on 2 x h100-sxm-8 (keras_jax), global batch 64"
    assert {r["layout"] for r in cnn["rows"]} == {"dp2", "fsdp2"}
    assert "--vocab-split: the CNN has no embedding table" in cnn["candidates"]["reasons"]


def test_the_basis_is_the_run_of_the_size_precision_and_batch_planned(tmp_path, capsys):
    # The plain tiny fp32 run at batch 32, the earliest; later runs of another size, precision or batch each
    # differ in one of what the plan asks for.
    amp = _record("amp", started="2026-11-25T00:03:00+00:00")
    amp["config"]["precision"] = "amp"
    folder = _folder(tmp_path / "r", _record("plain"), _record("mini", size="mini", started="2026-11-25T00:01:00"),
                     amp, _record("b16", batch=16, started="2026-11-25T00:02:00+00:00"))
    plan, _ = _plan(capsys, "--devices", "2", "--from", str(folder), "--backend", "keras_jax", tmp_path=tmp_path)
    assert plan["basis"].startswith("compute measured: torch_3d 1-device run plain (")
    plan, _ = _plan(capsys, "--devices", "2", "--from", str(folder), "--backend", "keras_jax", "--precision", "amp",
                    tmp_path=tmp_path)
    assert plan["basis"].startswith("compute measured: torch_3d 1-device run amp (")


def test_the_link_is_the_folder_s_probe_nearest_the_devices(tmp_path, capsys):
    runs = []
    for run_id, name, gbps in (("p2", "dp2", 2.0), ("p4", "dp4", 3.0)):
        run = _record(run_id, name, 0.05)
        run["backend_metrics"]["grad_comm"].update(link_GBps=gbps, ranks=Layout.parse(name).devices)
        runs.append(run)
    folder = _folder(tmp_path / "r", _record("r1"), *runs)
    for devices, says in (("2", "link: probe at 2 ranks, 2 GB/s busbw"), ("4", "link: probe at 4 ranks, 3 GB/s")):
        plan, _ = _plan(capsys, "--devices", devices, "--from", str(folder), "--backend", "keras_jax",
                        tmp_path=tmp_path)
        assert f"; {says}" in plan["basis"], plan["basis"]


def test_each_row_is_explained_against_the_pick_and_the_row_above(tmp_path, capsys):
    plan, _ = _plan(capsys, "--devices", "2", "--hardware", "h100-sxm-8", "--assume-mfu", "0.4", "--model-size",
                    "mini", "--micro-batches", "2", tmp_path=tmp_path)
    rows = plan["rows"]
    assert plan["pick"] == rows[0]["layout"] and rows[0]["explanation"].startswith("the pick; its step: compute ")
    pairs = 0
    for above, row in zip(rows, rows[1:]):
        gap = row["step_s"] / rows[0]["step_s"] - 1
        assert row["explanation"].startswith(f"{gap:+.1%} against the pick"), row
        # GPipe and 1F1B of one split: the same predicted step, told apart from the row above.
        if row["step_s"] == above["step_s"]:
            pairs += 1
            assert f"; the same predicted step as {above['layout']}" in row["explanation"], row
    assert pairs >= 4
    # The rows whose stage split is the one auto picks are flagged, pipelines only, one split (mini's four layers
    # do not split 2+2 in balance: the last stage holds the MLM head).
    auto = {r["layout"]: r["auto_split"] for r in rows}
    assert set(auto.values()) == {True, False}
    assert all(Layout.parse(name).pp == 2 for name, flag in auto.items() if flag is True)
    assert len({tuple(r["layers_per_stage"]) for r in rows if r["auto_split"]}) == 1


def test_the_errors_of_a_validation_make_rows_inseparable_and_limits_uncertain(tmp_path, capsys):
    saved = {"runs": [{"step_s": {"error": 0.5}}, {"step_s": {"error": -0.5}}],
             "summary": {"all": {"memory_per_rank": {"max_abs_error": 0.3}}}}
    folder = _folder(tmp_path / "r", _record("r1"))
    (folder / "validation.json").write_text(json.dumps(saved))
    base = ["--devices", "2", "--from", str(folder), "--backend", "keras_jax"]
    plan, _ = _plan(capsys, *base, tmp_path=tmp_path)
    # A ranking error of 100% (the two runs' errors differ by 1.0): no row is told apart from the pick.
    assert plan["ranking_error"] == 1.0 and [r["separable"] for r in plan["rows"][1:]] == [False] * 7
    assert all(r["explanation"].endswith("; within the ranking error (100.0%): not separable from the pick")
               for r in plan["rows"][1:])
    # At a limit of a layout's own predicted peak, within a memory error of 30% it may not fit.
    peak = plan["rows"][-1]["memory_per_rank_max"]
    limited, _ = _plan(capsys, *base, "--memory-per-device", f"{peak / GIB!r}", tmp_path=tmp_path)
    assert {r["layout"]: r["fit"] for r in limited["rows"]}[plan["rows"][-1]["layout"]] == "may not fit"


def test_a_plan_that_fits_nothing_says_so(tmp_path, capsys):
    plan, out = _plan(capsys, "--devices", "2", "--hardware", "h100-sxm-8", "--assume-mfu", "0.4",
                      "--memory-per-device", "0.001", "--backend", "keras_jax", tmp_path=tmp_path)
    assert plan["pick"] is None and all(r["rank"] == 0 and r["fit"] == "does not fit" for r in plan["rows"])
    assert "no layout is predicted to fit" in out and not [ln for ln in out.splitlines() if ln.startswith("│ ")]


def test_a_layout_the_backend_refuses_everywhere_is_one_line(capsys):
    # keras_jax has no fp16 loss scaling: every layout of the CNN refused, the first three reasons given.
    with pytest.raises(SystemExit) as exit_:
        plan_cli.main(["--devices", "2", "--hardware", "h100-sxm-8", "--assume-mfu", "0.4", "--backend",
                       "keras_jax", "--precision", "fp16", "--workload", "cnn"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    # The reasons as enumerate_layouts finds them, in its order.
    space = enumerate_layouts(model_spec("cnn"), 2, 64, None, plan_space.backend_refusal(
        "keras_jax", "cnn", "tiny", 2, 64, "fp16", hardware_files.load("h100-sxm-8")))
    reasons = list(space.refused)
    assert len(reasons) > 3 and not space.valid
    assert err == "bench.plan: error: no layout of 2 devices is valid for cnn tiny at global batch 64: " + \
        "; ".join(reasons[:3]) + "\n"
    assert any("--precision fp16: keras_jax has no loss scaling" in why for why in reasons)


def test_devices_and_size_reach_the_backend_check():
    refuse = plan_space.backend_refusal("keras_jax", "mlm", "mini", 4, 32, "fp32", CPU)
    assert KERAS_PIPELINE.replace("2", "4") in refuse(Layout(pp=4, micro_batches=4))
    assert refuse(Layout(dp=4)) is None and refuse(Layout(dp=2, tp=2)) is None
    # bench.run's own checks, of these devices and this batch.
    assert "4 devices are not divisible by model parallel 3" in refuse(Layout(tp=3))
    assert "global batch 32 is not divisible by 4 data-parallel replicas x 3" in refuse(Layout(dp=4, micro_batches=3))
    cnn = plan_space.backend_refusal("keras_jax", "cnn", "tiny", 2, 64, "fp32", CPU)
    assert "keras_jax cnn --model-parallel" in cnn(Layout(tp=2)) and cnn(Layout(dp=2)) is None
    assert "keras_jax cnn --recompute" in cnn(Layout(dp=2, recompute="full"))
    amp = plan_space.backend_refusal("keras_jax", "mlm", "tiny", 2, 32, "amp", CPU)
    fp16 = plan_space.backend_refusal("keras_jax", "mlm", "tiny", 2, 32, "fp16", CPU)
    assert amp(Layout(dp=2)) is None and "--precision fp16" in fp16(Layout(dp=2))
    gpu = plan_space.backend_refusal("keras_jax", "mlm", "tiny", 2, 32, "fp32", hardware_files.load("h100-sxm-8"))
    assert gpu(Layout(dp=2)) is None and KERAS_PIPELINE in gpu(Layout(pp=2, micro_batches=2))
    assert plan_space.backend_refusal("torch_3d", "cnn", "tiny", 2, 64, "fp32", CPU)(Layout(tp=2))


class _Recording:
    """The backend bench.plan_space loads, its check the real one, recording the run config and the devices each
    check was handed: what a plan asks a backend is the run a sweep would start with that layout."""

    def __init__(self, name: str):
        self.real, self.handed = _load_backend(name), []

    def check(self, cfg, plan) -> None:
        self.handed.append((cfg, plan))
        self.real.check(cfg, plan)


def _recording(monkeypatch) -> dict[str, _Recording]:
    loaded: dict[str, _Recording] = {}
    monkeypatch.setattr(plan_space, "load_backend", lambda name: loaded.setdefault(name, _Recording(name)))
    return loaded


def _asked(backend: str, devices: int, cuda: DevicePlan | None = None, **fields) -> tuple[RunConfig, DevicePlan]:
    """What a plan of `devices` hands `backend`'s check, written out: one strong-scaling synthetic step, no warmup,
    nothing written; on CPU one thread per device."""
    cfg = RunConfig(run_id="plan", backend=backend, devices=devices, scaling="strong", grad_accum=1,
                    data="synthetic", data_dir="", seed=0, total_steps=1, warmup_steps=0, out="",
                    device_kind=cuda.kind if cuda else "cpu", threads_per_device=0 if cuda else 1, **fields)
    return cfg, cuda or DevicePlan("cpu", devices, True, 1, devices > cpu_cores(),
                                   f"{devices} virtual CPU device(s) x 1 thread(s) on {cpu_cores()} core(s)"
                                   + (" (oversubscribed)" if devices > cpu_cores() else ""))


def test_the_backend_is_handed_the_run_the_layout_would_make(monkeypatch):
    loaded = _recording(monkeypatch)
    refuse = plan_space.backend_refusal("keras_jax", "mlm", "mini", 4, 32, "amp", CPU)
    assert refuse(Layout(dp=2, tp=2, recompute="full")) is None
    # Global batch 32 over 2 replicas: 16 a device.
    assert loaded["keras_jax"].handed == [_asked(
        "keras_jax", 4, workload="mlm", model_size="mini", precision="amp", batch_size=32, per_device_batch=16,
        layout=Layout(dp=2, tp=2, recompute="full"))]
    # bench.run's own refusal comes first: the backend is not asked about a layout no backend runs.
    assert "not divisible by model parallel 3" in refuse(Layout(tp=3))
    assert len(loaded["keras_jax"].handed) == 1

    # On a GPU cluster: whole devices named as the hardware file names them; 32 / 2 replicas / 4 micro-batches = 4.
    h100 = hardware_files.load("h100-sxm-8")
    gpu = plan_space.backend_refusal("torch_3d", "cnn", "tiny", 4, 32, "fp16", h100)
    assert gpu(Layout(dp=2, pp=2, micro_batches=4)).startswith("torch_3d cnn: --pipeline-stages: the CNN runs data")
    name = "NVIDIA H100 80GB HBM3"
    cuda = DevicePlan("cuda", 4, False, 0, False, f"4 of 4 x {name}", (name,) * 4)
    assert loaded["torch_3d"].handed == [_asked(
        "torch_3d", 4, cuda, workload="cnn", model_size="tiny", precision="fp16", batch_size=32, per_device_batch=4,
        layout=Layout(dp=2, pp=2, micro_batches=4))]
    # A hardware file that names no device: the devices are "CUDA device".
    plan_space.backend_refusal("torch_3d", "mlm", "tiny", 2, 8, "fp32", replace(h100, device_name=""))(Layout(dp=2))
    assert loaded["torch_3d"].handed[-1] == _asked(
        "torch_3d", 2, DevicePlan("cuda", 2, False, 0, False, "2 of 2 x CUDA device", ("CUDA device",) * 2),
        workload="mlm", model_size="tiny", precision="fp32", batch_size=8, per_device_batch=4, layout=Layout(dp=2))


def test_the_backend_refusal_is_its_own_words(monkeypatch):
    loaded = _recording(monkeypatch)
    fp16 = plan_space.backend_refusal("keras_jax", "mlm", "tiny", 2, 32, "fp16", CPU)
    assert fp16(Layout(dp=2)) == ("--precision fp16: keras_jax has no loss scaling in its stateless step; "
                                  "--precision amp (bfloat16) needs none")
    assert [cfg.precision for cfg, _ in loaded["keras_jax"].handed] == ["fp16"]


def test_the_backend_refusal_leaves_fitting_to_the_plan(monkeypatch):
    # On a GPU host bench.run's own fit check would hold each layout against this host's GPUs; the plan holds it
    # against its own limit (--memory-per-device or the hardware file's), so the backend must not refuse it here.
    monkeypatch.setattr("bench.fit.gpu_memory_bytes", lambda: (2**20, 2**20))  # 1 MiB: nothing fits
    refuse = plan_space.backend_refusal("keras_jax", "mlm", "tiny", 2, 32, "fp32", hardware_files.load("h100-sxm-8"))
    assert refuse(Layout(dp=2)) is None and refuse(Layout(tp=2)) is None


# ----------------------------------------------------------------------------- a plan from records

def test_each_layout_is_planned_from_the_one_device_runs_of_its_own_micro_batches(tmp_path, capsys):
    """As --validate predicts a run: a pipeline of 4 micro-batches from the 1-device run of 4 (here twice as fast
    as the run of one), dp2 from the run of one; the fixed cost per micro-batch fitted from the two is none."""
    def accumulating(run_id, step_s):
        r = _record(run_id, step_s=step_s, started="2026-11-25T00:01:00+00:00")
        r["config"]["grad_accum"] = 4
        return r
    plans = {}
    for name, step in (("fast", 0.05), ("same", 0.1)):
        folder = _folder(tmp_path / name, _record("k1"), accumulating("k4", step))
        plan, _ = _plan(capsys, "--devices", "2", "--from", str(folder), "--micro-batches", "4", tmp_path=tmp_path)
        plans[name] = {r["layout"]: r["parts_s"]["compute"] for r in plan["rows"]}
    assert plans["fast"]["dp2"] == pytest.approx(plans["same"]["dp2"])
    assert plans["fast"]["pp2-nmb4"] == pytest.approx(plans["same"]["pp2-nmb4"] / 2)


def test_a_plan_from_records_names_its_run_link_and_errors(tmp_path, capsys):
    one = _folder(tmp_path / "one", _record("r1"))
    plan, _ = _plan(capsys, "--devices", "2", "--from", str(one), "--backend", "keras_jax", tmp_path=tmp_path)
    assert plan["basis"].startswith("compute measured: torch_3d 1-device run r1")
    assert ("(torch_3d 1-device run at global batch 32, each layout from the 1-device runs of its micro-batches and "
            "recompute where measured; link: cpu-loopback-2core's description") in plan["basis"]
    assert plan["basis"].endswith("; errors from nowhere: no multi-device run in the folder to validate the model "
                                  "on (error unknown))")
    assert plan["ranking_error"] is None and plan["available_bytes"] == 23 * GIB   # the VM's 23 GiB
    # Multi-device runs in the folder: validated now, their number said.
    both = _folder(tmp_path / "both", _record("r1"), _record("r2", "dp2", 0.06, started="2026-11-25T00:01:00"),
                   _record("r3", "tp2", 0.08, started="2026-11-25T00:02:00"),
                   _record("r4", "pp2-nmb2", status="failed", started="2026-11-25T00:03:00"))
    plan, _ = _plan(capsys, "--devices", "2", "--from", str(both), "--backend", "keras_jax", tmp_path=tmp_path)
    assert plan["basis"].endswith(f"; errors from a validation of {both}'s multi-device runs, computed now "
                                  "(2 runs validated))")
    assert plan["ranking_error"] is not None and plan["memory_error"] is not None
    # A failed multi-device run alone is nothing to validate, nor a run that does not say its devices (one).
    unsaid = _record("r5", "dp2")
    del unsaid["devices"]
    failed = _folder(tmp_path / "failed", _record("r1"), _record("r4", "dp2", status="failed"), unsaid)
    plan, _ = _plan(capsys, "--devices", "2", "--from", str(failed), "--backend", "keras_jax", tmp_path=tmp_path)
    assert "errors from nowhere" in plan["basis"]
    # A saved validation.json is read instead, whatever the runs.
    saved = {"runs": [{"step_s": {"error": 0.1}}, {"step_s": {"error": -0.1}}, {"step_s": {"error": 0.0}}],
             "summary": {"all": {"memory_per_rank": {"max_abs_error": 0.3}}}}
    (both / "validation.json").write_text(json.dumps(saved))
    plan, out = _plan(capsys, "--devices", "2", "--from", str(both), "--backend", "keras_jax", tmp_path=tmp_path)
    assert plan["basis"].endswith(f"; errors from {both / 'validation.json'} (3 runs validated))")
    assert plan["ranking_error"] == pytest.approx(0.1) and plan["memory_error"] == 0.3  # pairs 0.2, 0.1, 0.1
    assert "ranking error 10.0%" in _flat(out) and "memory error 30%" in _flat(out)


def test_records_of_other_devices_do_not_give_the_link_or_the_errors(tmp_path, capsys):
    # A 2-device run on CUDA in a CPU plan's folder: not validated against the VM.
    gpu = _record("g2", "dp2", 0.06)
    gpu["device_kind"] = "cuda"
    folder = _folder(tmp_path / "r", _record("r1"), gpu)
    plan, _ = _plan(capsys, "--devices", "2", "--from", str(folder), "--backend", "keras_jax", tmp_path=tmp_path)
    assert "errors from nowhere" in plan["basis"]


def test_an_assumed_mfu_takes_the_folder_s_measured_peak(tmp_path, capsys):
    run = _record("r1")
    run["config"]["precision"] = "fp32"
    run["device_kind"], run["host"]["gpus"] = "cuda", ["NVIDIA H100 80GB HBM3"]
    run["achievable_peak"] = {"flops_per_s": 5e14}
    folder = _folder(tmp_path / "r", run)
    plan, _ = _plan(capsys, "--devices", "2", "--hardware", "h100-sxm-8", "--assume-mfu", "0.5", "--from",
                    str(folder), "--backend", "keras_jax", tmp_path=tmp_path)
    assert "measured achievable peak 500 TFLOP/s" in plan["basis"] and plan["basis"].endswith("(assumed)")


# ----------------------------------------------------------------------------- bench.plan --run

def _sweep(records: list[dict], calls: list, root: Path):
    """subprocess.run as bench.compare would run: the records written into --out (which must be under root)."""
    def run(cmd, **kwargs):
        calls.append((cmd, kwargs))
        out = Path(cmd[cmd.index("--out") + 1])
        assert out.is_relative_to(root), out
        _folder(out, *records)
        return subprocess.CompletedProcess(cmd, 0)
    return run


def test_compare_command_by_hand():
    plan = {"backend": "keras_jax", "workload": "mlm", "model_size": "mini", "global_batch": 16,
            "precision": "amp", "skip_eval": False}
    assert plan_run.compare_command(plan, ["dp2", "tp2"], "out") == [
        sys.executable, "-m", "bench.compare", "--layouts", "dp2,tp2", "--backends", "keras_jax", "--workloads",
        "mlm", "--model-size", "mini", "--batch-size", "16", "--precision", "amp", "--repeats", "1", "--data",
        "auto", "--out", "out"]
    cmd = plan_run.compare_command({**plan, "skip_eval": True}, ["dp2"], "o", steps=5, warmup=2, repeats=3,
                                   data="real", extra=("--x", "1"))
    assert cmd[3:] == ["--layouts", "dp2", "--backends", "keras_jax", "--workloads", "mlm", "--model-size",
                       "mini", "--batch-size", "16", "--precision", "amp", "--repeats", "3", "--data", "real",
                       "--out", "o", "--x", "1", "--steps", "5", "--warmup-steps", "2", "--skip-eval"]


def test_run_measures_the_top_k_and_writes_the_plan_beside_the_records(tmp_path, capsys, monkeypatch):
    source = _folder(tmp_path / "source", _record("r1"))
    out = tmp_path / "out"
    _folder(out, _record("old", "dp2", 0.01, backend="keras_jax"))   # a run from before: not this plan's
    calls = []
    monkeypatch.setattr(plan_run.subprocess, "run", _sweep(
        [_record("n1", "dp2", 0.2, started="2026-11-25T01:00:00", backend="keras_jax"),
         _record("n2", "fsdp2", 0.1, peak=2 * GIB, backend="keras_jax")], calls, tmp_path))
    written = tmp_path / "plan.json"
    assert plan_cli.main(["--devices", "2", "--from", str(source), "--backend", "keras_jax", "--top", "3",
                          "--run", "--out", str(out), "--steps", "6", "--warmup-steps", "2", "--repeats", "2",
                          "--data", "synthetic", "--memory-per-device", "1.5", "--skip-eval",
                          "--json", str(written)]) == 0
    printed = capsys.readouterr().out
    (cmd, kwargs), = calls
    plan = json.loads(written.read_text())
    top = [r["layout"] for r in plan["rows"] if r["rank"] and r["rank"] <= 3]
    assert len(top) == 3 and kwargs == {"stdin": subprocess.DEVNULL}
    assert cmd == [sys.executable, "-m", "bench.compare", "--layouts", ",".join(top), "--backends", "keras_jax",
                   "--workloads", "mlm", "--model-size", "tiny", "--batch-size", "32", "--precision", "fp32",
                   "--repeats", "2", "--data", "synthetic", "--out", str(out), "--memory-per-device", "1.5",
                   "--steps", "6", "--warmup-steps", "2", "--skip-eval"]
    assert _flat(f"running the top 3: {' '.join(cmd[1:])}") in _flat(printed)
    # fsdp2: 32 samples in 0.1 s, dp2 in 0.2 s: 320 and 160 samples/s, fsdp2 first; "old" is not counted.
    rows = {r["layout"]: r for r in plan["rows"]}
    fsdp, dp = rows["fsdp2"]["measured"], rows["dp2"]["measured"]
    assert (fsdp["samples_per_s"], fsdp["rank"], fsdp["runs"], fsdp["run_ids"]) == (pytest.approx(320), 1, 1, ["n2"])
    assert (dp["samples_per_s"], dp["rank"], dp["run_ids"]) == (pytest.approx(160), 2, ["n1"])
    assert fsdp["peak_per_rank_max"] == 2 * GIB and fsdp["step_s"] == pytest.approx(0.1)
    assert plan["measured"]["summary"].startswith("Measured: fastest fsdp2 (320.0 samples/s)")
    saved = out / "plans" / "plan-mlm-tiny-keras_jax-n2.json"
    assert json.loads(saved.read_text()) == plan
    flat = _flat(printed)
    assert f"plan with its measurements: {saved} (bench.report shows it)" in flat
    assert "predicted against measured" in flat and _flat(plan["measured"]["summary"]) in flat
    table = [line for line in printed.split("predicted against measured")[1].splitlines() if line.startswith("│ ")]
    measured_rows = [line for line in table if line.split("│")[2].strip() in ("fsdp2", "dp2")]
    assert len(measured_rows) == 2 and "320.0" in measured_rows[0] + measured_rows[1]
    assert "2.00" in next(line for line in measured_rows if "fsdp2" in line)   # its measured peak, GiB
    assert flat.endswith(f"plan: {written}")


def test_run_stops_when_bench_compare_fails(tmp_path, capsys, monkeypatch):
    source = _folder(tmp_path / "source", _record("r1"))
    monkeypatch.setattr(plan_run.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 3))
    with pytest.raises(SystemExit) as exit_:
        plan_cli.main(["--devices", "2", "--from", str(source), "--backend", "keras_jax", "--run", "--out",
                       str(tmp_path / "out"), "--json", str(tmp_path / "p.json")])
    assert exit_.value.code == "bench.plan: error: bench.compare exited 3"
    assert not (tmp_path / "p.json").exists() and not (tmp_path / "out" / "plans").exists()


def _measured_plan(pick: str = "a") -> dict:
    rows = [{"layout": name, "rank": i, "step_s": 0.1, "samples_per_s": 1.0, "memory_per_rank_max": GIB,
             "fit": "fits", "explanation": ""} for i, name in enumerate(("a", "b", "c", "d"), 1)]
    return {"title": "t", "workload": "mlm", "backend": "torch_3d", "devices": 2, "global_batch": 32,
            "model_size": "tiny", "pick": pick, "rows": rows}


def _run(run_id: str, name: str, steps: list[float], **kw) -> dict:
    r = {"run_id": run_id, "workload": "mlm", "backend": "torch_3d", "devices": 2, "global_batch": 32,
         "config": {"model_size": "tiny"}, "layout": Layout.parse(name).as_record(BERT_SIZES["tiny"], 32),
         "status": "ok", "step_times_s": steps,
         "step_time_s": {"p50": sorted(steps)[len(steps) // 2] if steps else None},
         "memory": {"process_peak_per_rank": [GIB, 2 * GIB]}}
    return {**r, **kw}


def test_attach_measured_takes_this_plan_s_runs_and_ranks_them():
    plan = _measured_plan()
    plan["rows"][0]["layout"], plan["rows"][1]["layout"] = "dp2", "tp2"
    plan["rows"][2]["layout"], plan["rows"][3]["layout"] = "fsdp2", "pp2-nmb2"
    plan["pick"] = "tp2"
    records = [_run("a", "dp2", [0.1] * 10), _run("b", "dp2", [0.1] * 10), _run("t", "tp2", [0.4] * 10),
               _run("f", "fsdp2", [], status="failed"), _run("f2", "fsdp2", [0.1] * 5, status="failed"),
               # another plan's runs: another size, batch, device count, backend, workload; one without a layout
               _run("x1", "pp2-nmb2", [0.01] * 5, config={"model_size": "mini"}),
               _run("x2", "pp2-nmb2", [0.01] * 5, global_batch=16), _run("x3", "pp2-nmb2", [0.01] * 5, devices=4),
               _run("x4", "pp2-nmb2", [0.01] * 5, backend="keras_jax"),
               _run("x5", "pp2-nmb2", [0.01] * 5, workload="cnn"), _run("x6", "pp2-nmb2", [0.01] * 5, layout=None)]
    rows = {r["layout"]: r for r in plan_run.attach_measured(plan, records)["rows"]}
    # dp2: two runs of 0.1 s steps, 320 samples/s with no spread; tp2 0.4 s: 80.
    dp = rows["dp2"]["measured"]
    assert dp == {"status": "ok", "runs": 2, "run_ids": ["a", "b"], "samples_per_s": pytest.approx(320),
                  "low": pytest.approx(320), "high": pytest.approx(320), "step_s": pytest.approx(0.1),
                  "peak_per_rank_max": 2 * GIB, "rank": 1}
    assert rows["tp2"]["measured"]["rank"] == 2 and rows["tp2"]["measured"]["samples_per_s"] == pytest.approx(80)
    assert rows["fsdp2"]["measured"] == {"status": "failed", "samples_per_s": None}   # the last run's status
    assert rows["pp2-nmb2"]["measured"] is None
    assert plan["measured"]["summary"] == ("Measured: fastest dp2 (320.0 samples/s); the pick tp2 measured 80.0 "
                                           "(25.0% of it, 2 of 2).")
    # A cnn plan takes runs of any size.
    cnn = _measured_plan()
    cnn["workload"], cnn["rows"][0]["layout"] = "cnn", "dp2"
    run = _run("c", "dp2", [0.1] * 4, workload="cnn", config={})
    assert plan_run.attach_measured(cnn, [run])["rows"][0]["measured"]["runs"] == 1
    # No run measured: no summary.
    assert plan_run.attach_measured(_measured_plan(), [])["measured"] is None


def test_the_summary_names_the_pick_and_what_the_fastest_cannot_be_told_from():
    plan = _measured_plan("b")
    for row, name in zip(plan["rows"], ("dp2", "tp2", "fsdp2", "pp2-nmb2")):
        row["layout"] = name
    plan["pick"] = "dp2"
    # dp2 steps vary around 0.1 s, tp2 and fsdp2 1% and 2% slower: their intervals overlap; pp2-nmb2 at 0.2 s
    # is apart.
    noisy = [0.09, 0.11, 0.1, 0.095, 0.105, 0.1, 0.09, 0.11]
    records = [_run("d", "dp2", noisy), _run("t", "tp2", [s * 1.01 for s in noisy]),
               _run("f", "fsdp2", [s * 1.02 for s in noisy]), _run("p", "pp2-nmb2", [0.2] * 8)]
    summary = plan_run.attach_measured(plan, records)["measured"]["summary"]
    dp = plan["rows"][0]["measured"]["samples_per_s"]
    assert summary == (f"Measured: fastest dp2 ({dp:,.1f} samples/s), the plan's pick; inside the fastest's 95% "
                       "interval, so not separable by this measurement: tp2, fsdp2.")
    plan["pick"] = "none-measured"
    assert plan_run.attach_measured(plan, records)["measured"]["summary"].startswith(
        f"Measured: fastest dp2 ({dp:,.1f} samples/s); inside")


def test_measured_memory_missing_is_none():
    plan = _measured_plan()
    plan["rows"][0]["layout"] = "dp2"
    run = _run("d", "dp2", [0.1] * 4, memory={})
    assert plan_run.attach_measured(plan, [run])["rows"][0]["measured"]["peak_per_rank_max"] is None


# ----------------------------------------------------------------------------- bench.plan_check

def test_plan_check_layouts_are_torch_3d_s_on_two_devices():
    # tiny: dp2, fsdp2 and fsdp2-zero2, tp2 with and without the vocabulary split (each with and without
    # recompute), and the pipelines: micro-batches 2, 4, 8 x gpipe, 1f1b x the cuts of tiny's layers x recompute
    # (test_plan's count).
    names = plan_check.layouts("tiny")
    layers = BERT_SIZES["tiny"].layers
    assert len(names) == 6 + 4 + 3 * 2 * (layers - 1) * 2 and len(set(names)) == len(names)
    assert {"dp2", "fsdp2-rc", "fsdp2-rc-zero2", "tp2-vocab", "pp2-nmb8-1f1b-rc"} <= set(names)
    assert not {Layout.parse(n).micro_batches for n in names} - {1, 2, 4, 8}


def test_plan_check_measures_each_size_with_bench_compare(tmp_path, capsys, monkeypatch):
    calls = []

    def run(cmd, **kwargs):   # two layouts measured, each at a peak of 1 MiB, far below any limit
        calls.append((cmd, kwargs))
        out = Path(cmd[cmd.index("--out") + 1])
        assert out.is_relative_to(tmp_path), out
        _folder(out, _record("r1"), _record("a", "dp2", 1.0, peak=2**20, steps=3),
                _record("b", "fsdp2", 1.0, peak=2**20, steps=3, status="failed"))
        return subprocess.CompletedProcess(cmd, 1)
    monkeypatch.setattr(plan_check.subprocess, "run", run)
    out = tmp_path / "pc"
    assert plan_check.main(["--out", str(out), "--sizes", "tiny", "--steps", "3", "--warmup-steps", "1",
                            "--repeats", "3"]) == 1
    (cmd, kwargs), = calls
    names = plan_check.layouts("tiny")
    assert kwargs == {"stdin": subprocess.DEVNULL, "check": False}
    assert cmd == [sys.executable, "-m", "bench.compare", "--layouts", ",".join(names), "--backends", "torch_3d",
                   "--workloads", "mlm", "--model-size", "tiny", "--batch-size", "32", "--precision", "fp32",
                   "--repeats", "3", "--data", "real", "--out", str(out / "mlm-tiny"), "--breakdown-steps", "2",
                   "--threads-per-device", "1", "--profile", "2", "--steps", "3", "--warmup-steps", "1",
                   "--skip-eval"]
    printed = capsys.readouterr().out
    assert printed.startswith(f"plan-check tiny: measuring {len(names)} layouts and their 1-device runs: "
                              f"{' '.join(cmd[1:])}\n")
    assert printed.rstrip().endswith("PLAN CHECK FAILS")
    lines = printed.splitlines()[1:]
    assert lines[0] == f"== mlm tiny, 2 devices, global batch 32: 1 layouts measured ({out / 'mlm-tiny'})"
    assert lines[1] == "load: not recorded"
    # dp2 alone measured, at 32 samples/s (1 s a step); not the pick.
    assert lines[2].startswith("pick ") and lines[2].endswith(
        "measured n/a samples/s; measured best dp2: 32.0; ratio n/a (goal >= 95%): FAILS")
    assert lines[3] == "Spearman(predicted, measured step) over 1: n/a (goal >= 0.8): FAILS"
    # Every call on dp2 is wrong (1 MiB measured is within any limit); fsdp2 failed, so it is not measured.
    wrong = lines[4].split("of which measured within their limit: ")[1].split("; not measured: ")[0].split("), ")
    assert len(wrong) >= 2 and all(w.startswith("dp2 (measured 0.001 GiB, limit 0.") for w in wrong)
    unmeasured = lines[4].split("; not measured: ")[1].split("; closest: ")[0].split(", ")
    assert "fsdp2" in unmeasured and set(unmeasured) <= set(names) - {"dp2"} and len(unmeasured) >= 2
    assert unmeasured == sorted(unmeasured)
    assert lines[4].split("; closest: ")[1].startswith("dp2 measured 0.00x the 0.") and lines[4].endswith(": FAILS")
    assert lines[5] == "errors allowed (from no other size's runs: none allowed): ranking n/a, memory n/a"


def test_plan_check_defaults():
    args = plan_check.build_parser().parse_args([])
    assert (args.out, args.sizes, args.steps, args.warmup_steps, args.repeats, args.reuse) == \
        ("results/plan-check", ["tiny", "mini"], 24, 4, 1, False)


def test_plan_check_help(capsys):
    with pytest.raises(SystemExit):
        plan_check.main(["--help"])
    text = _flat(capsys.readouterr().out)
    assert "python -m bench.plan_check [--out DIR] [--sizes tiny,mini] [--steps 24] [--warmup-steps 4] " \
        "[--repeats R] [--reuse] options:" in text
    assert text.endswith("--out OUT one folder per size under it --sizes SIZES --steps STEPS --warmup-steps "
                         "WARMUP_STEPS --repeats REPEATS measure every configuration R times, the rows interleaved "
                         "(bench.compare --repeats) --reuse measure nothing: check against the records already in "
                         "each size's folder")


@pytest.mark.parametrize("args", [["--sizes", "huge"], ["--steps", "0"], ["--warmup-steps", "0"], ["--repeats", "0"]],
                         ids=["size", "steps", "warmup", "repeats"])
def test_plan_check_bad_input_is_one_line(args, capsys):
    with pytest.raises(SystemExit) as exit_:
        plan_check.main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(f"bench.plan_check: error: argument {args[0]}: ") and \
        err.count("\n") == 1


class _Stdout(io.StringIO):
    """stdout that keeps what was flushed apart from what was only written."""
    flushed = ""

    def flush(self):
        self.flushed = self.getvalue()


def test_plan_check_says_what_it_measures_before_bench_compare_prints(tmp_path, monkeypatch):
    stdout, seen = _Stdout(), []
    monkeypatch.setattr(sys, "stdout", stdout)

    def run(cmd, **kwargs):   # bench.compare writes to the same terminal: the line must be out first
        seen.append(stdout.flushed)
        return subprocess.CompletedProcess(cmd, 0)
    monkeypatch.setattr(plan_check.subprocess, "run", run)
    plan_check.measure("tiny", tmp_path, plan_check.build_parser().parse_args([]))
    assert seen[0].startswith("plan-check tiny: measuring 22 layouts")


def test_plan_check_figures_and_verdicts_by_hand():
    assert plan_check._closest(None) == "n/a"
    assert plan_check._closest({"layout": "dp2", "measured_over_limit": 1.2345, "limit_bytes": 0.5 * GIB}) == \
        "dp2 measured 1.23x the 0.500 GiB limit"
    assert plan_check._fmt(None, ".1%") == "n/a"
    assert (plan_check._fmt(1234.56, ",.1f"), plan_check._fmt(0.81234, ".3f"), plan_check._fmt(0.1234, ".1%")) == \
        ("1,234.6", "0.812", "12.3%")
    assert (plan_check._verdict(True), plan_check._verdict(False)) == ("holds", "FAILS")


def test_load_figures_by_hand():
    records = [{"load": {"other_busy_cores": 0.5, "loadavg_1m_before": 2.0}, "host": {"cores": 2},
                "started_at": "t0"},
               {"load": {"other_busy_cores": 1.5, "loadavg_1m_before": 4.0}, "started_at": "t1"},
               {"load": {"other_busy_cores": 0.1}, "started_at": "t2"}, {"started_at": "t3"}]
    # busy 0.1, 0.5, 1.5: median 0.5; load averages 2 and 4: median 3.0.
    assert plan_check.load_figures(records) == (
        "load while measuring: other programs' busy cores median 0.50, largest 1.50 (of 2); 1-minute load average "
        "before a run median 3.0, largest 4.0; t0 to t3")
    assert plan_check.load_figures([{"load": {"loadavg_1m_before": 2.0}}]) == "load: not recorded"
    assert plan_check.load_figures([]) == "load: not recorded"


def _check_folder(out: Path, size: str = "tiny", pick_slower: float = 1.0) -> tuple[Path, dict]:
    """The 1-device run and every layout measured exactly as the plan predicts it (its step and its peak), but
    the pick's step `pick_slower` times longer."""
    folder = _folder(out / f"mlm-{size}", _record("r1", size=size, load={"other_busy_cores": 0.2,
                                                                          "loadavg_1m_before": 1.0}))
    predicted = plan_cli.make_plan(plan_check.plan_args(size, folder, None), validation={})
    runs = [_record(f"m{i}", r["layout"], r["step_s"] * (pick_slower if i == 0 else 1.0), r["memory_per_rank_max"],
                    size=size, steps=5, started=f"2026-11-25T01:{i:02d}:00+00:00",
                    load={"other_busy_cores": 0.4, "loadavg_1m_before": 3.0})
            for i, r in enumerate(predicted["rows"])]
    return _folder(folder, *runs), predicted


def _reuse(out: Path, pick_slower: float) -> tuple:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plan_space, "load_backend", _load_backend)
        folder, predicted = _check_folder(out, pick_slower=pick_slower)
        capture = io.StringIO()
        mp.setattr(sys, "stdout", capture)
        rc = plan_check.main(["--reuse", "--out", str(out), "--sizes", "tiny"])
    return folder, predicted, capture.getvalue(), rc


@pytest.fixture
def reused(tmp_path):
    """bench.plan_check --reuse --sizes tiny over a folder measured as predicted: the folder, the prediction,
    what it printed and returned. Set up for each test (0.5 s): mutmut gives what a fixture calls to the test that
    set it up, so at module scope only the first of these tests ran against the mutants of plan_check.main."""
    return _reuse(tmp_path, 1.0)


def test_plan_check_fails_when_the_pick_alone_measures_slow(tmp_path):
    folder, predicted, printed, rc = _reuse(tmp_path, 1.1)
    lines = printed.splitlines()
    # The pick 10% slower than predicted: the second of the plan is measured fastest; the ranking, one layout
    # moved, and the memory calls still hold, and the check fails on the pick alone.
    first, second = predicted["rows"][:2]
    ratio = (32 / (first["step_s"] * 1.1)) / (32 / second["step_s"])
    assert ratio < 0.95 and rc == 1 and lines[-1] == "PLAN CHECK FAILS"
    assert lines[2].endswith(f"measured best {second['layout']}: {32 / second['step_s']:,.1f}; ratio {ratio:.1%} "
                             "(goal >= 95%): FAILS")
    assert lines[3].endswith("(goal >= 0.8): holds") and lines[4].endswith(": holds")


def test_plan_check_holds_when_measured_as_predicted(reused):
    folder, predicted, _, _ = reused
    plan = json.loads((folder / "plans" / "plan-check-mlm-tiny.json").read_text())
    result = plan["check"]
    # plan_args: 2 devices, global batch 32, micro-batches 2, 4, 8, torch_3d, fp32, evaluation skipped.
    assert (plan["devices"], plan["global_batch"], plan["backend"], plan["precision"], plan["skip_eval"]) == \
        (2, 32, "torch_3d", "fp32", True)
    assert plan["hardware"] == "cpu-loopback-2core" and plan["model_size"] == "tiny"
    assert {Layout.parse(r["layout"]).micro_batches for r in plan["rows"]} == {1, 2, 4, 8}
    assert plan["available_bytes"] == 23 * GIB
    # Every layout measured at its predicted step: the pick is the fastest, the orders agree.
    assert result["pick"]["layout"] == result["pick"]["measured_best"] == predicted["pick"]
    assert result["pick"]["ratio"] == pytest.approx(1.0) and result["pick"]["holds"]
    assert result["ranking"]["configurations"] == len(plan_check.layouts("tiny")) and result["ranking"]["holds"]
    assert result["ranking"]["spearman"] == pytest.approx(1.0) and result["fit"]["holds"]
    assert [r["measured"]["samples_per_s"] for r in plan["rows"]] == \
        [pytest.approx(32 / r["step_s"]) for r in predicted["rows"]]
    # Under each limit, the layouts called "does not fit" are those whose predicted peak is over it.
    assert plan["fit_plans"] and all(p["available_bytes"] < 23 * GIB for p in plan["fit_plans"])
    assert len(plan["fit_plans"]) == result["fit"]["limits"]
    for limited in plan["fit_plans"]:
        assert set(limited["does_not_fit"]) == {r["layout"] for r in plan["rows"]
                                                if r["memory_per_rank_max"] > limited["available_bytes"]}


def test_plan_check_reuse_prints_each_goal(reused):
    folder, predicted, printed, rc = reused
    lines = printed.splitlines()
    n = len(plan_check.layouts("tiny"))
    assert rc == 0 and lines[0] == f"== mlm tiny, 2 devices, global batch 32: {n} layouts measured ({folder})"
    # The load of the ok runs, the 1-device run first (the earliest started): busy 0.2 once, 0.4 n times.
    assert lines[1] == ("load while measuring: other programs' busy cores median 0.40, largest 0.40 (of 2); "
                        "1-minute load average before a run median 3.0, largest 3.0; 2026-11-25T00:00:00+00:00 to "
                        f"2026-11-25T01:{n - 1:02d}:00+00:00")
    pick = predicted["pick"]
    sps = 32 / predicted["rows"][0]["step_s"]    # measured at its predicted step
    assert lines[2] == (f"pick {pick}: measured {sps:,.1f} samples/s; measured best {pick}: {sps:,.1f}; ratio "
                        "100.0% (goal >= 95%): holds")
    assert lines[3] == f"Spearman(predicted, measured step) over {n}: 1.000 (goal >= 0.8): holds"
    fit = json.loads((folder / "plans" / "plan-check-mlm-tiny.json").read_text())["check"]["fit"]
    closest = fit["closest"]
    # Each peak measured as predicted, so the closest call is a layout over its limit by the least.
    assert closest["measured_over_limit"] > 1
    assert lines[4] == (f"under {fit['limits']} memory limits (each layout's tightest 'does not fit' limit P/(1+e), "
                        f"and the smallest predicted peak): {fit['calls']} calls 'does not fit' on "
                        f"{fit['layouts_called']} layouts, of which measured within their limit: none; not "
                        f"measured: none; closest: {closest['layout']} measured {closest['measured_over_limit']:.2f}x "
                        f"the {closest['limit_bytes'] / GIB:.3f} GiB limit: holds")
    assert lines[5] == "errors allowed (from no other size's runs: none allowed): ranking n/a, memory n/a"
    assert lines[6] == "PLAN CHECK HOLDS" and len(lines) == 7


def test_plan_check_takes_the_errors_of_the_other_size(tmp_path):
    _check_folder(tmp_path, "tiny")
    mini = _folder(tmp_path / "mlm-mini", _record("q1", size="mini"),
                   _record("q2", "dp2", 0.3, size="mini", started="2026-11-25T02:00:00+00:00"),
                   _record("q3", "tp2", 0.5, size="mini", started="2026-11-25T02:01:00+00:00"))
    stdout = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "stdout", stdout)
        plan_check.main(["--reuse", "--out", str(tmp_path), "--sizes", "tiny,mini"])
    printed = stdout.getvalue()
    assert printed.count("== mlm ") == 2 and f"== mlm mini, 2 devices, global batch 32: 2 layouts measured ({mini})" \
        in printed
    # tiny's errors from mini's two validated runs (a ranking error), mini's from tiny's.
    errors = [line for line in printed.splitlines() if line.startswith("errors allowed")]
    assert len(errors) == 2 and all("ranking n/a" not in e and "memory n/a" not in e for e in errors)
    assert errors[0].startswith(f"errors allowed (from the mini runs' validation, {mini}): ")
    # tiny checked alone: the mini folder an earlier check left under --out still gives its allowances
    stdout = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "stdout", stdout)
        plan_check.main(["--reuse", "--out", str(tmp_path), "--sizes", "tiny"])
    assert stdout.getvalue().count("== mlm ") == 1 and stdout.getvalue().splitlines()[-2] == errors[0]


def test_a_plan_predicts_each_layout_as_its_backend_runs_it(tmp_path, monkeypatch):
    """bench.plan --backend torch_ddp: its one layout (dp2) predicted with DDP's 25 MiB buckets (base's gradients
    in many all-reduces, each with its latency), not as torch_3d runs dp2; nothing measured yet."""
    monkeypatch.setattr(plan_space, "load_backend", _load_backend)
    folder = _folder(tmp_path / "mlm", _record("r1", size="tiny"))
    steps = {}
    for backend in ("torch_3d", "torch_ddp"):
        args = plan_check.plan_args("base", folder, None)
        args.backend = backend
        plan = plan_cli.make_plan(args, validation={})
        assert "measured" in plan and plan["measured"] is None
        steps[backend] = {r["layout"]: r["step_s"] for r in plan["rows"]}
    assert list(steps["torch_ddp"]) == ["dp2"] and steps["torch_ddp"]["dp2"] > steps["torch_3d"]["dp2"]
