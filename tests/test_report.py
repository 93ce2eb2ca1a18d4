"""bench.report against a fixture sweep: two hosts, two backends, both workloads, 1/2/4 devices, plus failed
and unsupported runs. Table cells and plotted points must be the records' own values."""
from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import pytest

from bench.reporting.compose import build_report
from bench.reporting.document import Heading, Image, Table, Text, to_markdown
from common.config_key import NO_REFERENCE
from common.record import skeleton
from common.results import load_records, validate_record, write_record
from tests.conftest import run_cli, run_in_process

HOSTS = {
    "host-a": {"host": {"name": "host-a", "cpu": "Intel(R) Xeon(R) Platinum 8480+", "cores": 16, "gpus": [],
                        "os": "Linux-6.8-x86_64", "python": "3.11.7"},
               "device_kind": "cpu", "virtual": True, "threads_per_device": 4},
    "host-b": {"host": {"name": "host-b", "cpu": "AMD EPYC 9454", "cores": 96, "gpus": ["NVIDIA H100 80GB HBM3"] * 4,
                        "os": "Linux-6.8-x86_64", "python": "3.11.7"},
               "device_kind": "cuda", "virtual": False, "threads_per_device": None},
}
STRATEGIES = {"torch_ddp": "DistributedDataParallel", "torch_dp": "DataParallel"}
ONE_DEVICE_SPS = {("host-a", "torch_ddp"): 180.0, ("host-a", "torch_dp"): 150.0,
                  ("host-b", "torch_ddp"): 9000.0, ("host-b", "torch_dp"): 7000.0}
EFFICIENCY = {("host-a", "torch_ddp"): {1: 1.0, 2: 0.9, 4: 0.75}, ("host-a", "torch_dp"): {1: 1.0},
              ("host-b", "torch_ddp"): {1: 1.0, 2: 0.95, 4: 0.9}, ("host-b", "torch_dp"): {1: 1.0, 2: 0.8, 4: 0.6}}
SEQ_LEN = 128
DP_ON_CPU = "DataParallel needs CUDA devices; this machine has none"
OOM = "worker rank 3 exited with signal 9 (killed: out of memory?)"


def _ok_fields(host: str, backend: str, workload: str, n: int, index: int) -> dict:
    per_device = 64 if workload == "cnn" else 32
    scale = 1 if workload == "cnn" else 0.25
    sps = ONE_DEVICE_SPS[host, backend] * scale * n * EFFICIENCY[host, backend][n] + index * 0.123
    step = per_device * n / sps
    curve = [[s, 2.3 - 0.02 * s - 0.001 * index] for s in range(1, 51)]
    metric, split = ("accuracy", "test") if workload == "cnn" else ("masked_accuracy", "valid")
    history = [{"step": s, "elapsed_s": s * step * 1.2, "value": 0.1 + s / 80 + index / 1000, "loss": 2.3 - s / 40}
               for s in (10, 20, 30, 40, 50)]
    return {
        "status": "ok", "measured_steps": 45, "per_device_batch": per_device, "global_batch": per_device * n,
        "samples_per_s": sps, "tokens_per_s": sps * SEQ_LEN if workload == "mlm" else None,
        "step_time_s": {"mean": step, "p50": step * 0.98, "p90": step * 1.1, "min": step * 0.9, "max": step * 1.6,
                        "std": step * 0.05},
        # Half the runs carry per-step samples (box plots), half only statistics (range plots).
        "step_times_s": [step * f for f in (0.9, 0.95, 0.98, 1.0, 1.1, 1.6)] if index % 2 == 0 else None,
        "data_wait_fraction": 0.01 * n + index / 10000, "params": 2328298, "flops_per_sample": 69257088,
        "achieved_flops": sps * 69257088, "peak_memory_bytes": (600 + 10 * index) * 2**20,
        "loss": {"first": curve[0][1], "last": curve[-1][1], "curve": curve},
        "eval": {"metric": metric, "split": split, "value": history[-1]["value"], "count": 10000,
                 "loss": history[-1]["loss"]},
        "eval_history": history, "steps_done": 50, "total_steps": 50, "stopped_early": False,
        "duration_s": 60.0, "oversubscribed": False,
    }


def fixture_records() -> list[dict]:
    records = []
    for h, (host, machine) in enumerate(HOSTS.items()):
        for backend in ("torch_ddp", "torch_dp"):
            for workload in ("cnn", "mlm"):
                for n in (1, 2, 4):
                    index = len(records)
                    run_id = f"2026112{h}T10{index:02d}00Z-{backend}-{workload}-n{n}-{index:06x}"
                    record = skeleton(run_id, backend, workload, n, f"2026-11-2{h}T10:{index:02d}:00+00:00",
                                      sweep_id=f"sweep-2026112{h}T100000Z-{host}", data="real", scaling="weak",
                                      strategy=STRATEGIES[backend], framework="torch", framework_version="2.4.1",
                                      warmup_steps=5, seed=0, host=machine["host"],
                                      versions={"numpy": "2.1.3", "torch": "2.4.1"},
                                      device_kind=machine["device_kind"], virtual=machine["virtual"],
                                      threads_per_device=machine["threads_per_device"],
                                      devices_description=f"{n} {machine['device_kind']} device(s) on {host}")
                    if backend == "torch_dp" and host == "host-a" and n > 1:
                        record.update(status="unsupported", error=DP_ON_CPU, duration_s=0.1)
                    elif backend == "torch_ddp" and host == "host-b" and workload == "mlm" and n == 4:
                        record.update(status="failed", error=OOM, duration_s=12.0)
                    else:
                        record.update(_ok_fields(host, backend, workload, n, index))
                    assert validate_record(record) == [], run_id
                    records.append(record)
    return records


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("results")
    for record in fixture_records():
        write_record(record, out)
    return out


@pytest.fixture(scope="module")
def records(results) -> list[dict]:
    return load_records(results)


@pytest.fixture(scope="module")
def built(results):
    return build_report(load_records(results), str(results))


@pytest.fixture(scope="module")
def written(results) -> Path:
    proc = run_cli("bench.report", "--results", str(results))
    assert proc.returncode == 0, proc.stderr
    return results


def _md_tables(markdown: str) -> dict[str, list[dict]]:
    """Per workload section, the rows of its run table as {column: cell}."""
    tables = {}
    for section in re.split(r"^## Workload `", markdown, flags=re.M)[1:]:
        workload = section.split("`", 1)[0]
        lines = [ln for ln in section.splitlines() if ln.startswith("|")]
        split = [[c.strip() for c in re.split(r"(?<!\\)\|", ln)[1:-1]] for ln in lines]
        tables[workload] = [dict(zip(split[0], row)) for row in split[2:]]
    return tables


def _ok(records, **match) -> list[dict]:
    return [r for r in records if r["status"] == "ok" and all(r[k] == v for k, v in match.items())]


@pytest.mark.e2e
def test_tables_hold_every_run_with_the_record_values(written):
    records = load_records(written)
    tables = _md_tables((written / "report.md").read_text())
    assert sum(len(rows) for rows in tables.values()) == len(records)
    for r in records:
        [row] = [row for row in tables[r["workload"]]
                 if (row["backend"], row["host"], row["N"]) == (r["backend"], r["host"]["name"], str(r["devices"]))]
        assert row["status"] == r["status"]
        assert row["device"] == ("cpu (virtual)" if r["host"]["name"] == "host-a" else "cuda")
        if r["status"] != "ok":
            assert row["reason / notes"] == r["error"]
            assert row["samples/s" if r["workload"] == "cnn" else "tokens/s"] == ""
            continue
        throughput = r["tokens_per_s"] if r["workload"] == "mlm" else r["samples_per_s"]
        [one] = _ok(records, backend=r["backend"], workload=r["workload"], devices=1, host=r["host"])
        st = r["step_time_s"]
        assert row["samples/s" if r["workload"] == "cnn" else "tokens/s"] == f"{throughput:,.1f}"
        assert row["scaling efficiency"] == f"{r['samples_per_s'] / (r['devices'] * one['samples_per_s']):.2f}"
        assert row["step p50 (ms)"] == f"{st['p50'] * 1e3:,.2f}"
        assert row["step p90 (ms)"] == f"{st['p90'] * 1e3:,.2f}"
        assert row["data wait"] == f"{r['data_wait_fraction']:.1%}"
        assert row["peak memory (MiB)"] == f"{r['peak_memory_bytes'] / 2**20:,.0f}"
        assert row[r["eval"]["metric"]] == f"{r['eval']['value']:.4f}"


def _label(backend: str, host: str) -> str:
    return f"{backend} · {host} · {HOSTS[host]['device_kind']}"


def _value(record: dict) -> float:
    return record["tokens_per_s"] if record["workload"] == "mlm" else record["samples_per_s"]


def _plot(built, workload: str, kind: str):
    [plot] = [p for p in built[1][workload] if p.slug == f"{workload}-{kind}"]
    return plot


def _series(records, backend, workload, host) -> list[dict]:
    return sorted((r for r in _ok(records, backend=backend, workload=workload) if r["host"]["name"] == host),
                  key=lambda r: r["devices"])


def _drawn_lines(plot) -> dict[str, list[tuple]]:
    """What the Axes actually hold, read back from matplotlib."""
    drawn = {}
    for ax in plot.figure.axes:
        for line in ax.get_lines():
            if not line.get_label().startswith("_"):
                drawn.setdefault(line.get_label(), []).extend(zip(line.get_xdata(), line.get_ydata()))
    return drawn


SERIES = [(workload, backend, host) for workload in ("cnn", "mlm") for backend in STRATEGIES for host in HOSTS]


@pytest.mark.parametrize("workload,backend,host", SERIES)
def test_throughput_points_and_ideal_line_are_the_records(built, records, workload, backend, host):
    plot, ok = _plot(built, workload, "throughput"), _series(records, backend, workload, host)
    assert ok[0]["devices"] == 1
    label = _label(backend, host)
    assert plot.data[label] == [(r["devices"], _value(r)) for r in ok]
    assert plot.data[f"ideal: {label}"] == [(r["devices"], r["devices"] * _value(ok[0])) for r in ok]
    drawn = _drawn_lines(plot)
    assert drawn[label] == plot.data[label]
    assert drawn[f"ideal: {label}"] == plot.data[f"ideal: {label}"]


@pytest.mark.parametrize("workload,backend,host", SERIES)
def test_efficiency_points_are_the_records(built, records, workload, backend, host):
    plot, ok = _plot(built, workload, "efficiency"), _series(records, backend, workload, host)
    expected = [(r["devices"], r["samples_per_s"] / (r["devices"] * ok[0]["samples_per_s"])) for r in ok]
    got = plot.data[_label(backend, host)]
    assert [n for n, _ in got] == [n for n, _ in expected]
    assert [e for _, e in got] == pytest.approx([e for _, e in expected], rel=1e-12)
    assert _drawn_lines(plot)[_label(backend, host)] == got


@pytest.mark.parametrize("workload,backend,host", SERIES)
def test_loss_accuracy_and_step_time_are_the_records(built, records, workload, backend, host):
    label = _label(backend, host)
    for r in _series(records, backend, workload, host):
        key = f"{label} · N={r['devices']}"
        assert _plot(built, workload, "loss").data[key] == [tuple(p) for p in r["loss"]["curve"]]
        assert _plot(built, workload, "time-to-accuracy").data[key] == [
            (h["elapsed_s"], h["value"]) for h in r["eval_history"]]
        assert (r["devices"], r["step_time_s"]) in _plot(built, workload, "step-time").data[label]


def test_hosts_never_share_a_line(built, records):
    for plots in built[1].values():
        for plot in plots:
            for label in _drawn_lines(plot):
                hosts = [h for h in HOSTS if h in label]
                assert len(hosts) == 1, f"{plot.slug}: line {label!r} names no single host"
    # Every throughput point of a host-a line is a host-a record's value, none another host's.
    for workload in ("cnn", "mlm"):
        for label, points in _plot(built, workload, "throughput").data.items():
            if label.startswith("ideal"):
                continue
            host = next(h for h in HOSTS if h in label)
            mine = {(r["devices"], _value(r)) for r in _ok(records, workload=workload) if r["host"]["name"] == host}
            assert set(points) <= mine


@pytest.mark.e2e
def test_header_names_hardware_versions_and_data(written):
    text = (written / "report.md").read_text()
    for host in HOSTS.values():
        assert host["host"]["name"] in text and host["host"]["cpu"] in text
    assert "NVIDIA H100 80GB HBM3" in text
    assert "torch 2.4.1" in text
    assert re.search(r"\| cnn \| MNIST \| real \| 12 \|", text)
    assert "from 24 run records" in text and "(19 ok, 1 failed, 4 unsupported, 0 invalid)" in text


@pytest.mark.e2e
def test_outputs_are_written_and_html_is_self_contained(written):
    pngs = sorted((written / "plots").glob("*.png"))
    assert len(pngs) == 10  # five figures per workload
    for png in pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", png.read_bytes()[16:24])
        assert width > 400 and height > 300
    markdown = (written / "report.md").read_text()
    assert sorted(re.findall(r"\]\((plots/[^)]+\.png)\)", markdown)) == [f"plots/{p.name}" for p in pngs]
    page = (written / "report.html").read_text()
    assert "http://" not in page and "https://" not in page
    sources = re.findall(r'src="([^"]*)"', page)
    assert len(sources) == len(pngs) and all(s.startswith("data:image/png;base64,") for s in sources)
    assert "<link" not in page and "<script" not in page
    assert '<tr class="failed">' in page and OOM in page
    assert '<tr class="unsupported">' in page and DP_ON_CPU in page
    assert not list(written.glob(".*.tmp")) and not list((written / "plots").glob(".*.tmp"))
    # Reports are meant to be shared, like the records they are made from (they were 0600).
    for path in [written / "report.md", written / "report.html", *pngs, *(written / "runs").glob("*.json")]:
        assert path.stat().st_mode & 0o777 == 0o644, path


@pytest.mark.e2e
def test_filters_select_runs_and_plots_hold_only_this_report(records, tmp_path):
    results = tmp_path / "results"
    for record in records:
        write_record(record, results)
    assert run_cli("bench.report", "--results", str(results)).returncode == 0
    proc = run_cli("bench.report", "--results", str(results), "--workload", "mlm", "--backends", "torch_dp",
                   "--since", "2026-11-21")
    assert proc.returncode == 0, proc.stderr
    text = (results / "report.md").read_text()
    assert "from 3 run records" in text and "## Workload `cnn`" not in text
    assert sorted(p.name for p in (results / "plots").glob("*.png")) == sorted(
        f"mlm-{k}.png" for k in ("throughput", "efficiency", "step-time", "loss", "time-to-accuracy"))


@pytest.mark.parametrize("args", [
    ["--results", "{missing}"],
    ["--results", "{results}", "--since", "2100-01-01"],
    ["--results", "{results}", "--since", "yesterday"],
    ["--results", "{results}", "--backends", "torch_ddp,jax_pmap"],
    ["--results", "{results}", "--workload", "resnet"],
    ["--results", "{empty}"],
])
def test_bad_input_is_one_line_and_exit_2_with_nothing_written(tmp_path, args):
    """bench.report's main() in this process (test_cli holds one bad input of it as a process)."""
    results = tmp_path / "results"
    write_record(fixture_records()[0], results)
    (tmp_path / "empty").mkdir()
    paths = {"missing": tmp_path / "nope", "results": results, "empty": tmp_path / "empty"}
    code, _, stderr = run_in_process("bench.report", *(a.format(**paths) for a in args))
    assert code == 2
    assert stderr.startswith("bench.report: error: ") and stderr.count("\n") == 1, stderr
    assert not (results / "report.md").exists() and not (results / "plots").exists()


@pytest.mark.e2e
def test_every_row_says_which_data_it_used(records, tmp_path):
    """Synthetic data must be visible wherever a row is: an eval of 1.0000 on synthetic data is not MNIST's."""
    from rich.console import Console

    from bench.compare import print_table
    from common.results import summary_frame

    mixed = [{**r, "data": "synthetic" if i % 2 else "real"} for i, r in enumerate(records)]
    console = Console(record=True, width=400)
    print_table(console, summary_frame(mixed))
    rows = [ln for ln in console.export_text().splitlines() if " torch_d" in ln]
    assert len(rows) == len(mixed)
    assert sum("synthetic" in ln for ln in rows) == len(mixed) // 2
    assert all(("synthetic" in ln) != (" real " in ln) for ln in rows)
    # All synthetic: nothing varies, and the report's tables still name the data in every row.
    results = tmp_path / "results"
    for record in records:
        write_record({**record, "data": "synthetic"}, results)
    assert run_cli("bench.report", "--results", str(results)).returncode == 0
    tables = _md_tables((results / "report.md").read_text())
    cells = [row.get("data") for rows in tables.values() for row in rows]
    assert cells == ["synthetic"] * len(records)


def _two_core_sweep() -> list[dict]:
    """Three backends with the same loss curves (as they should be) at 1, 2 and 4 virtual CPU devices on
    a 2-core host, so N=4 is oversubscribed, and a fourth backend whose every run failed."""
    host = HOSTS["host-a"]
    records = []
    for b, backend in enumerate(("torch_ddp", "torch_dp", "tf_mirrored", "mindspore_auto")):
        for n in (1, 2, 4):
            run_id = f"20261123T10{b}{n}00Z-{backend}-cnn-n{n}-{b:03x}{n:03x}"
            record = skeleton(run_id, backend, "cnn", n, f"2026-11-23T10:0{b}:0{n}+00:00", sweep_id="sweep-2core",
                              data="real", scaling="weak", strategy=backend, framework="x", framework_version="1",
                              warmup_steps=5, seed=0, host={**host["host"], "cores": 2}, device_kind="cpu",
                              virtual=True, threads_per_device=1)
            if backend == "mindspore_auto":
                record.update(status="failed", error="msrun exited with code 1", duration_s=3.0)
            else:
                record.update(_ok_fields("host-a", "torch_ddp", "cnn", n, 0), oversubscribed=n > 2)
            records.append(record)
    return records


def test_figures_do_not_mislead(tmp_path):
    blocks, plots = build_report(_two_core_sweep(), str(tmp_path))
    by_kind = {p.slug.removeprefix("cnn-"): p for p in plots["cnn"]}
    for plot in by_kind.values():  # the backend whose runs all failed is named in every figure
        assert plot.absent == ["mindspore_auto (3 failed)"], plot.slug
        assert "not drawn, no ok run: mindspore_auto (3 failed)" in plot.figure.get_suptitle()
    for kind in ("throughput", "efficiency"):  # a ring around each oversubscribed point, and a legend entry
        [ax] = by_kind[kind].figure.axes
        rings = [line for line in ax.get_lines() if line.get_label() == "_oversubscribed"]
        assert len(rings) == 3 and all(list(line.get_xdata()) == [4] for line in rings), kind
        legend = [t.get_text() for t in by_kind[kind].figure.legends[0].get_texts()]
        assert "oversubscribed: devices x threads > cores" in legend
    for ax in by_kind["loss"].figure.axes:  # identical curves: each drawn narrower on top of the one before
        widths = [line.get_linewidth() for line in ax.get_lines()]
        assert len(widths) == 3 and widths == sorted(widths, reverse=True) and len(set(widths)) == 3
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
    for ax in by_kind["time-to-accuracy"].figure.axes:  # not cut: both axes from zero, accuracy up to 1
        assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= 1 and ax.get_xlim()[0] == 0
    captions = [b.caption for b in blocks if isinstance(b, Image)]
    assert captions and all("Not drawn, no ok run: mindspore_auto (3 failed)." in c for c in captions)
    # Each figure under the workload's table, in the order drawn, its PNG the plot's own (its size tells it).
    images = [b for b in blocks if isinstance(b, Image)]
    assert [(b.path, b.title, struct.unpack(">II", b.png[16:24])) for b in images] == [
        ("plots/cnn-throughput.png", "cnn: throughput", (825, 484)),
        ("plots/cnn-efficiency.png", "cnn: scaling efficiency", (825, 484)),
        ("plots/cnn-step-time.png", "cnn: step-time distribution", (825, 484)),
        ("plots/cnn-loss.png", "cnn: loss curves", (1518, 484)),
        ("plots/cnn-time-to-accuracy.png", "cnn: time to accuracy", (1518, 484))]
    assert images[0].caption.startswith("Data: real MNIST. Frameworks: x 1. Same in every line: host host-a, ")
    assert images[0].caption.endswith(". torch_dp: strategy/mode torch_dp. Not drawn, no ok run: mindspore_auto "
                                      "(3 failed).")
    assert [b.caption for b in images] == [p.caption for p in plots["cnn"]]
    start = blocks.index(Heading("Workload `cnn`", 2))
    assert isinstance(blocks[start + 1], Text) and isinstance(blocks[start + 2], Table)
    assert blocks[start + 3:start + 8] == images
    if os.environ.get("PARBENCH_KEEP_FIGURES"):  # to look at them
        for plot in plots["cnn"]:
            Path(os.environ["PARBENCH_KEEP_FIGURES"], f"{plot.slug}.png").write_bytes(plot.png())


def test_one_gpu_run_shares_a_panel_with_the_virtual_runs_it_anchors():
    """One GPU: both backends' whole-GPU N=1 and virtual N=2/4 (processes or replicas sharing it) on one axis,
    the virtual points hollow, the MFU in the table."""
    host = {**HOSTS["host-b"]["host"], "gpus": ["NVIDIA H100 80GB HBM3"]}
    records = []
    for backend in STRATEGIES:
        for n in (1, 2, 4):
            index = len(records)
            record = skeleton(f"20261123T10{index:02d}00Z-{backend}-cnn-n{n}-{index:06x}", backend, "cnn", n,
                              f"2026-11-23T10:{index:02d}:00+00:00", sweep_id="sweep-one-gpu", data="real",
                              scaling="weak", strategy=STRATEGIES[backend], framework="torch",
                              framework_version="2.4.1", warmup_steps=5, seed=0, host=host, versions={},
                              device_kind="cuda", virtual=n > 1, threads_per_device=None,
                              devices_description=f"{n} on one GPU")
            record.update(_ok_fields("host-b", backend, "cnn", n, index), mfu=0.01 * (index + 1),
                          mfu_achievable=0.02 * (index + 1))
            records.append(record)
    blocks, plots = build_report(records, "results")
    throughput = _plot((blocks, plots), "cnn", "throughput")
    [ax] = throughput.figure.axes
    assert "hollow markers: virtual devices" in ax.get_title()
    drawn = {line.get_label(): list(zip(line.get_xdata(), line.get_ydata())) for line in ax.get_lines()}
    for backend in STRATEGIES:
        [label] = [k for k in throughput.data if k.startswith(backend)]
        assert [n for n, _ in drawn[label]] == [1, 2, 4]  # the anchor and its virtual runs on one line
        assert [n for n, _ in drawn[f"_virtual: {label}"]] == [2, 4]
    [row] = [row for row in _md_tables(to_markdown(blocks))["cnn"] if row["N"] == "4" and row["backend"] == "torch_dp"]
    assert row["MFU"] == "6.0%" and row["MFU (measured peak)"] == "12.0%"


def test_markdown_renders_each_block_and_escapes_what_would_break_a_table():
    from bench.reporting.document import markdown_table

    blocks = [Heading("parbench report", 1), Heading("Workload `cnn`", 3), Text("Runs: `a|b`."),
              Table(["run", "reason"], [["r1", "a | b\\c\nnext"], ["r2", 7]]),
              Image("plots/cnn-loss.png", "cnn: loss", "Data: real.", b"\x89PNG")]
    assert to_markdown(blocks) == (
        "# parbench report\n\n### Workload `cnn`\n\nRuns: `a|b`.\n\n"
        "| run | reason |\n|---|---|\n| r1 | a \\| b\\\\c next |\n| r2 | 7 |\n\n"
        "![cnn: loss](plots/cnn-loss.png)\n\n*Data: real.*\n")
    assert markdown_table(["a|b", "c"], []) == "| a\\|b | c |\n|---|---|"
    assert to_markdown([]) == "\n"


def test_html_renders_each_block_self_contained_and_marks_failed_rows():
    from bench.reporting.html import CSS, to_html

    blocks = [Heading("Workload `cnn` <1>", 2), Text("A `code` and `more` & text"),
              Table(["run_id", "status", "peak_memory"], [["r<1>", "failed", 1.5], ["r2", "ok", None]]),
              Table(["a_b"], [["x"]]),
              Image("plots/cnn-loss.png", 'cnn: "loss"', "Data: `real`.", b"\x89PNG\r\n")]
    assert to_html(blocks, "parbench <report>") == (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>parbench &lt;report&gt;</title>'
        f"<style>{CSS}</style></head><body>\n"
        "<h2>Workload <code>cnn</code> &lt;1&gt;</h2>\n"
        "<p>A <code>code</code> and <code>more</code> &amp; text</p>\n"
        "<table><thead><tr><th>run_<wbr>id</th><th>status</th><th>peak_<wbr>memory</th></tr></thead><tbody>"
        '<tr class="failed"><td>r&lt;1&gt;</td><td>failed</td><td>1.5</td></tr>'
        '<tr class="ok"><td>r2</td><td>ok</td><td>None</td></tr></tbody></table>\n'
        "<table><thead><tr><th>a_<wbr>b</th></tr></thead><tbody><tr><td>x</td></tr></tbody></table>\n"
        '<figure><img alt="cnn: &quot;loss&quot;" src="data:image/png;base64,iVBORw0K">'
        "<figcaption>Data: <code>real</code>.</figcaption></figure>\n"
        "</body></html>\n")
    # The status column found wherever it is.
    assert '<tr class="unsupported"><td>unsupported</td>' in to_html([Table(["status"], [["unsupported"]])], "t")


def _machine_record(name: str | None, backend: str = "torch_ddp", **fields) -> dict:
    host = {"name": name, "cpu": "AMD EPYC 9454", "cores": 96, "gpus": ["NVIDIA H100", "NVIDIA H100", "NVIDIA A100"],
            "os": "Linux-6.8", "python": "3.11.7"} if name == "b" else \
        {"name": name, "cpu": "Xeon", "cores": 16, "gpus": [], "os": "Linux-6.1", "python": "3.10.4"}
    return {"host": host if name else None, "backend": backend, "workload": "cnn", "status": "ok", **fields}


def test_the_header_tables_name_each_machine_software_and_dataset_once():
    from bench.reporting.compose import _data, _hardware, _software

    records = [
        _machine_record("b", device_kind="cuda", devices_description="2 x H100", framework="torch",
                        framework_version="2.4.1", git_sha="abc", versions={"torch": "2.4.1", "numpy": "2.1"},
                        data="real"),
        _machine_record("b", device_kind="cuda", virtual=True, devices_description="4 on one H100",
                        framework="torch", framework_version="2.4.1", git_sha="abc",
                        versions={"numpy": "2.1", "torch": "2.4.1"}, data="real"),
        _machine_record("a", backend="tf_mirrored", workload="mlm", devices_description=None, data="synthetic"),
        _machine_record(None, backend="jax", workload="lm"),
        _machine_record("a", backend="tf_mirrored", workload="mlm", device_kind="", data="synthetic",
                        devices_description="", framework="tensorflow", framework_version=None),
    ]
    hardware = _hardware(records)
    assert hardware.columns == ["host", "CPU", "cores", "GPUs", "OS", "Python", "device kinds", "devices used"]
    assert hardware.rows == [
        ["None", "", "", "none", "", "", "unknown", ""],
        ["a", "Xeon", "16", "none", "Linux-6.1", "3.10.4", "unknown", ""],
        ["b", "AMD EPYC 9454", "96", "NVIDIA A100, NVIDIA H100", "Linux-6.8", "3.11.7", "cuda, cuda (virtual)",
         "2 x H100; 4 on one H100"]]
    software = _software(records)
    assert software.columns == ["host", "backend", "framework", "parbench commit", "packages"]
    assert software.rows == [
        ["None", "jax", "not started", "None", ""],
        ["a", "tf_mirrored", "not started", "None", ""],
        ["a", "tf_mirrored", "tensorflow", "None", ""],
        ["b", "torch_ddp", "torch 2.4.1", "abc", "numpy 2.1, torch 2.4.1"]]
    data = _data(records)
    assert data.columns == ["workload", "dataset", "data", "runs"]
    assert data.rows == [["cnn", "MNIST", "real", "2"], ["lm", "WikiText-2", "unknown", "1"],
                         ["mlm", "WikiText-2", "synthetic", "2"]]
    assert _data([{"workload": "vit", "data": "real"}]).rows == [["vit", "?", "real", "1"]]


class _Now:
    @staticmethod
    def now(zone):
        from datetime import datetime
        return datetime(2026, 11, 28, 9, 30, 15, 123456, tzinfo=zone)


DEFINITIONS = (
    "A configuration is everything a run was asked to do but its device count: backend, strategy or mode, workload, "
    "model size, precision, batch (per device under weak scaling, global under strong), micro-batches, layout and "
    "its options, compile mode, data, device kind, host, threads per device and scaling mode. Scaling efficiency is "
    "samples/s(N) / (N x samples/s(1)) against the latest ok 1-device run of the same configuration in the same "
    "sweep (a layout that splits the model: of its global batch and micro-batches on one device); where there is "
    f"none the cell says \"{NO_REFERENCE}\". A table row is the latest run of a configuration and device count in "
    "its sweep; a line in a figure joins the runs of one configuration in one sweep.")


def test_the_header_says_where_the_runs_come_from_and_what_a_configuration_is(monkeypatch):
    from bench.reporting import compose

    monkeypatch.setattr(compose, "datetime", _Now)
    runs = [_machine_record("a", status=s, sweep_id=sweep, started_at=f"2026-11-2{i}T10:00:00+00:00", run_id=str(i))
            for i, (s, sweep) in enumerate([("ok", "sweep-one"), ("failed", "sweep-one"), ("ok", "sweep-one"),
                                            ("invalid", "sweep-two")])]
    blocks = compose.header(runs[:3], "results", "", 0, runs[:3])
    assert blocks[:3] == [
        Heading("parbench report", 1),
        Text("Generated 2026-11-28T09:30:15+00:00 from 3 run records in `results/runs` (2 ok, 1 failed, "
             "0 unsupported, 0 invalid)."),
        Text(DEFINITIONS)]
    assert blocks[3:5] == [Heading("Sweeps", 2), Text("Every sweep of the folder; `bench.report --sweep ID` reports "
                                                      "one.")]
    assert blocks[5].rows[0][0] == "one"
    assert blocks[6:] == [Heading("Hardware", 2), compose._hardware(runs[:3]), Heading("Software", 2),
                          compose._software(runs[:3]), Heading("Data", 2), compose._data(runs[:3])]
    # Filtered out of a folder of two sweeps: the report names its sweep, and the files it skipped.
    blocks = compose.header(runs[3:], "out", "--sweep two", 2, runs)
    assert blocks[1] == Text("Generated 2026-11-28T09:30:15+00:00 from 1 run records in `out/runs` (0 ok, 0 failed, "
                             "0 unsupported, 1 invalid). Filters: --sweep two. 2 file(s) in `runs/` skipped: not a "
                             "valid run record.")
    assert blocks[4] == Text("Every sweep of the folder; `bench.report --sweep ID` reports one. This report: two.")
    assert [row[0] for row in blocks[5].rows] == ["one", "two"]
    # A filter that keeps runs of both sweeps names both.
    assert compose.header(runs[2:], "out", "--workload cnn", 0, runs)[4] == Text(
        "Every sweep of the folder; `bench.report --sweep ID` reports one. This report: one, two.")
    # One sweep in the folder, or no filter: nothing to name.
    for folder, filters in ((runs[3:], "--sweep two"), (runs, "")):
        assert compose.header(runs[3:], "out", filters, 0, folder)[4] == Text(
            "Every sweep of the folder; `bench.report --sweep ID` reports one.")


def test_the_report_is_the_header_then_each_workload_then_the_sections_across_workloads(monkeypatch):
    """build_report's order, and what each part is given: the layout runs leave the device-count lines for
    the layout section; `folder` (default: the records) feeds the sweep index."""
    from bench.reporting import compose
    from tests.test_layouts import layout_records

    def part(name):
        return lambda *args: [Text(name)]

    monkeypatch.setattr(compose, "header", lambda records, results, filters, skipped, folder: [
        Text(f"header {len(records)} {results} {filters!r} {skipped} {len(folder)}")])
    monkeypatch.setattr(compose, "workload_section", lambda w, frame, by_id, series: (
        [Text(f"{w}: {len(frame)} rows, {len(by_id)} records, lines {[s.key.backend for s in series]}")], [f"{w}-1"]))
    monkeypatch.setattr(compose, "layout_section", lambda w, frame, by_id: (
        [Text(f"{w} layouts: {len(frame)} rows, {len(by_id)} records")] if len(frame[frame.workload == w]) else [],
        [f"{w}-layouts"] if len(frame[frame.workload == w]) else []))
    monkeypatch.setattr(compose, "repeats_section", lambda records: ([Text(f"repeats {len(records)}")], ["r"]))
    for name in ("calibration_blocks", "breakdown_blocks", "attribution_blocks"):
        monkeypatch.setattr(compose, name, part(name))
    for name in ("validation_blocks", "published_blocks", "plan_blocks"):
        monkeypatch.setattr(compose, name, lambda results, name=name: [Text(f"{name} {results!r}")])
    records = _two_core_sweep() + layout_records()
    blocks, plots = compose.build_report(records, "res", "--workload x", 3)
    assert [b.text for b in blocks] == [
        "header 18 res '--workload x' 3 18",
        "cnn: 18 rows, 18 records, lines ['tf_mirrored', 'torch_ddp', 'torch_dp']",
        "mlm: 18 rows, 18 records, lines []",
        "mlm layouts: 6 rows, 18 records",
        "repeats 18", "calibration_blocks", "breakdown_blocks", "validation_blocks PosixPath('res')",
        "published_blocks PosixPath('res')", "attribution_blocks", "plan_blocks PosixPath('res')"]
    assert plots == {"cnn": ["cnn-1"], "mlm": ["mlm-1", "mlm-layouts"], "repeats": ["r"]}
    blocks, _ = compose.build_report(records[:12], "res", folder=records)
    assert blocks[0].text == "header 12 res '' 0 18"
    # a machine's or a run's field left empty is named once among the others, and "unknown" when none is given
    assert (compose._join(["b", "", None, "a", "b", 2]), compose._join(["", None])) == ("2, a, b", "unknown")


def test_a_workload_that_never_scaled_has_no_efficiency_figure(monkeypatch):
    from bench.reporting.compose import figure_caption, workload_section
    from bench.reporting.plots import Plot
    from bench.reporting.series import build_series
    from common.results import summary_frame

    monkeypatch.setattr(Plot, "png", lambda self: self.slug.encode())      # what is drawn, not its pixels

    records = [r for r in _two_core_sweep() if r["devices"] == 1 and r["status"] == "ok"]
    frame = summary_frame(records)
    series = build_series(records, frame)["cnn"]
    blocks, plots = workload_section("cnn", frame, {r["run_id"]: r for r in records}, series)
    # Two backends without an ok run: each named, in the caption and in the figures.
    failed = [{**r, "run_id": f"{r['run_id']}-{backend}", "backend": backend, "status": "failed"}
              for r in records[:1] for backend in ("keras_jax", "mindspore_auto")]
    both = summary_frame(records + failed)
    _, named = workload_section("cnn", both, {r["run_id"]: r for r in records + failed}, series)
    assert named[0].caption.endswith(" Not drawn, no ok run: keras_jax (1 failed); mindspore_auto (1 failed).")
    assert named[0].absent == ["keras_jax (1 failed)", "mindspore_auto (1 failed)"]
    assert [p.slug for p in plots] == ["cnn-throughput", "cnn-step-time", "cnn-loss", "cnn-time-to-accuracy"]
    assert [(b.path, b.png) for b in blocks if isinstance(b, Image)] == [(f"plots/{p.slug}.png", p.slug.encode())
                                                                        for p in plots]
    # Every backend drawn: nothing named as absent.
    caption = figure_caption("cnn", series)
    assert caption.startswith("Data: real MNIST. Frameworks: x 1. ") and "Not drawn" not in caption
    assert plots[0].caption == caption and all(p.absent == [] for p in plots)


def test_a_figure_caption_names_the_data_and_frameworks_and_what_the_lines_share(monkeypatch):
    from types import SimpleNamespace

    from bench.reporting import compose

    runs = {1: {"data": "real", "framework": "torch", "framework_version": "2.4.1"},
            2: {"data": "synthetic", "framework": "torch", "framework_version": "2.4.1"}}
    series = [SimpleNamespace(runs=runs), SimpleNamespace(runs={4: {"data": "real", "framework": "jax",
                                                                  "framework_version": "0.4"}})]
    shared = {"": ""}
    monkeypatch.setattr(compose, "describe_lines", lambda lines: shared[""] if lines == series else None)
    assert compose.figure_caption("cnn", series) == ("Data: real MNIST, synthetic MNIST. Frameworks: jax 0.4, "
                                                     "torch 2.4.1.")
    # A workload without a named dataset: the data as recorded; lines that share nothing: no sentence for it.
    assert compose.figure_caption("vit", series) == "Data: real, synthetic. Frameworks: jax 0.4, torch 2.4.1."
    shared[""] = "Same in every line: host a."
    assert compose.figure_caption("vit", series) == ("Data: real, synthetic. Frameworks: jax 0.4, torch 2.4.1. "
                                                     "Same in every line: host a.")
