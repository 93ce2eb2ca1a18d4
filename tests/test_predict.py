"""bench.predict's model (common/predict): its formulas against hand computations, and --validate against the
records of a real layout sweep."""
from __future__ import annotations

import json
import math
import os
import shutil
import statistics
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from bench import predict as predict_cli
from bench.report import main as report_main
from bench.reporting import validation as validation_report
from common.hostinfo import load_over
from common.layout import Layout, check_name
from common.predict import hardware as hardware_files
from common.predict.basis import (
    MEASURE_THE_SPLIT,
    UNPROBED,
    Basis,
    background_load,
    from_mfu,
    interruption_share,
    measured_memory,
    per_process,
)
from common.predict.collectives import bus_factor, cost_s, crosses_nodes
from common.predict.executed import collectives
from common.predict.hardware import Link
from common.predict.kernels import compute_label, device_compute
from common.predict.memory import fsdp_numel, state_bytes
from common.predict.step import pipeline_s, predict, sync_factor
from common.predict.validation import validate
from common.results import load_records
from common.sections import CoRun
from common.spec import BERT_SIZES, model_spec
from tests.conftest import run_cli

TINY, BASE = BERT_SIZES["tiny"], BERT_SIZES["base"]
TINY_PARAMS = 4_723_586   # common.spec's count of the tiny MLM
TINY_TENSORS = 42         # embeddings 5, 16 per layer, head 5: one AdamW step counter each
LINK = Link("node", busbw_GBps=100.0, latency_s=1e-5)


# ----------------------------------------------------------------------------- collectives

def test_bus_factors_are_nccl_tests_own():
    assert bus_factor("all_reduce", 8) == 2 * 7 / 8
    assert bus_factor("reduce_scatter", 8) == bus_factor("all_gather", 8) == 7 / 8
    assert bus_factor("send_recv", 2) == bus_factor("broadcast", 4) == 1.0


def test_alpha_beta_cost_by_hand():
    # A ring all-reduce of 1 GB over 8 ranks at 100 GB/s busbw: 2 x 7/8 x 1e9 / 1e11 s, plus 14 steps x 10 us.
    assert cost_s("all_reduce", 1e9, 8, LINK) == pytest.approx(0.0175 + 14e-5)
    assert cost_s("all_gather", 1e9, 8, LINK) == pytest.approx(0.00875 + 7e-5)
    assert cost_s("send_recv", 1e6, 2, LINK) == pytest.approx(1e-5 + 1e-5)
    assert cost_s("all_reduce", 1e9, 1, LINK) == 0.0
    # a kind a probe timed apart goes at its own bus bandwidth, the others at the link's
    probed = replace(LINK, busbw_by_kind={"all_gather": LINK.busbw_GBps / 4})
    assert cost_s("all_gather", 1e9, 8, probed) == pytest.approx(4 * 0.00875 + 7e-5)
    assert cost_s("all_reduce", 1e9, 8, probed) == cost_s("all_reduce", 1e9, 8, LINK)


def test_placement_keeps_tensor_parallel_inside_a_node():
    assert not crosses_nodes(Layout(dp=8, tp=8), "tp", 8)      # tp innermost: ranks 0..7
    assert crosses_nodes(Layout(dp=8, tp=8), "dp", 8)          # dp stride 8: one rank per node
    assert not crosses_nodes(Layout(dp=2, tp=4), "dp", 8)      # 2 x 4 ranks fill one node
    assert crosses_nodes(Layout(dp=4, tp=2, pp=2), "pp", 8)    # stages 8 ranks apart


# ----------------------------------------------------------------------------- state bytes

def _adamw(elements: int, tensors: int) -> dict:
    return {"params": 4 * elements, "grads": 4 * elements, "optimizer": 8 * elements + 4 * tensors}


def test_state_bytes_of_one_device_and_data_parallel_are_the_whole_model():
    for layout in (Layout(), Layout(dp=2)):
        for rank in range(layout.devices):
            assert vars(state_bytes(TINY, layout, rank)) == _adamw(TINY_PARAMS, TINY_TENSORS)


def test_state_bytes_under_tensor_parallel_by_hand():
    h, i = TINY.hidden, TINY.intermediate
    whole_layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 4 * h
    # Q, K, V and FFN-in split by rows (weight and bias), output and FFN-out by columns (bias whole), norms whole.
    tp2_layer = 3 * (h * h // 2 + h // 2) + (h * h // 2 + h) + (h * i // 2 + i // 2) + (i * h // 2 + h) + 4 * h
    elements = TINY_PARAMS - TINY.layers * (whole_layer - tp2_layer)
    for rank in range(2):
        assert vars(state_bytes(TINY, Layout(tp=2), rank)) == _adamw(elements, TINY_TENSORS)


def test_state_bytes_under_fsdp_follow_torch_chunk():
    # Every tiny dimension 0 is even: each of 2 ranks holds exactly half.
    for rank in range(2):
        assert vars(state_bytes(TINY, Layout(fsdp=2), rank)) == \
            _adamw(TINY_PARAMS // 2, TINY_TENSORS)
    # Keras' AdamW counts its steps in one int64 per device (keras_jax's record of fsdp2: 18,894,352 bytes).
    keras = state_bytes(TINY, Layout(fsdp=2), 0, backend="keras_jax")
    assert keras.optimizer == 8 * (TINY_PARAMS // 2) + 8
    # torch.chunk of 5 rows in 4: 2, 2, 1, 0 rows.
    assert [fsdp_numel((5, 3), 4, i) for i in range(4)] == [6, 6, 3, 0]


def test_state_bytes_of_pipeline_stages_hold_the_tied_embedding_twice():
    v, h, s, t = TINY.vocab_size, TINY.hidden, TINY.seq_len, TINY.type_vocab_size
    embeddings = (v + s + t) * h + 2 * h
    head = (h * h + h) + 2 * h + v
    layer = (TINY_PARAMS - embeddings - head) // TINY.layers
    first = state_bytes(TINY, Layout(pp=2, micro_batches=4), 0)
    last = state_bytes(TINY, Layout(pp=2, micro_batches=4), 1)
    assert vars(first) == _adamw(embeddings + layer, 5 + 16)
    assert vars(last) == _adamw(v * h + layer + head, 1 + 16 + 5)


# ----------------------------------------------------------------------------- collectives per layout

def _by_kind(layout: Layout, stage: int = 0, batch: int = 32, backend: str = "torch_3d") -> dict:
    out = {}
    for c in collectives(TINY, layout, batch, stage, backend):
        out.setdefault(c.kind, [0, 0])
        out[c.kind][0] += c.calls
        out[c.kind][1] += c.total_bytes
    return out


def test_collectives_by_hand():
    activation = 4 * 32 * TINY.seq_len * TINY.hidden
    # Megatron TP: 2 all-reduces forward, 2 backward (the attention's and FFN-in's input gradients) per layer.
    assert _by_kind(Layout(tp=2)) == {"all_reduce": [TINY.layers * 4, TINY.layers * 4 * activation]}
    assert _by_kind(Layout(dp=2)) == {"all_reduce": [1, 4 * TINY_PARAMS]}
    # DDP's 25 MiB buckets: the 18.9 MB of gradients fit one.
    assert _by_kind(Layout(dp=2), backend="torch_ddp") == {"all_reduce": [1, 4 * TINY_PARAMS]}
    fsdp = _by_kind(Layout(fsdp=2))
    assert fsdp["reduce_scatter"] == [TINY.layers + 1, 4 * TINY_PARAMS]
    # Every layer gathered twice (forward, backward), the root once: the whole model plus the layers again.
    h, i = TINY.hidden, TINY.intermediate
    layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 4 * h
    assert fsdp["all_gather"] == [2 * TINY.layers + 1, pytest.approx(4 * (TINY_PARAMS + TINY.layers * layer))]
    pp = Layout(pp=2, micro_batches=4)
    micro = 4 * 8 * TINY.seq_len * TINY.hidden
    assert _by_kind(pp, 0) == {"send_recv": [8, 8 * micro], "all_reduce": [1, 4 * TINY.vocab_size * TINY.hidden]}


# ----------------------------------------------------------------------------- pipeline and step

def test_pipeline_of_equal_stages_idles_the_analytic_bubble():
    for p, m in ((2, 4), (4, 8), (4, 4)):
        total = pipeline_s([1.0] * p, m)
        assert total == m + p - 1
        assert (total - m) / total == pytest.approx(Layout(pp=p, micro_batches=m).bubble())


def _basis(**kw) -> Basis:
    values = dict(s_per_mac_sample=1e-12, s_per_micro_batch=0.0, s_per_param=0.0, s_per_step=0.0,
                  memory_overhead=0.0, training_overhead=None, threads_per_device=None, cores=None, label="test")
    return Basis(**{**values, **kw})


def test_data_parallel_step_is_its_share_of_compute_plus_the_exposed_all_reduce():
    hw = hardware_files.load("h100-sxm-8")
    one = predict(BASE, Layout(), 32, hw, _basis())
    dp8 = predict(BASE, Layout(dp=8), 256, hw, _basis())
    assert dp8.compute_s == pytest.approx(one.compute_s)   # 32 samples per rank either way
    expected = cost_s("all_reduce", 4 * BASE.param_count(), 8, hw.link(False))
    assert dp8.comm_exposed_s == pytest.approx(expected)   # torch_3d reduces after the backward
    assert dp8.step_s == pytest.approx(one.step_s + expected)
    # DDP's buckets hide behind the backward on a GPU: only the last bucket stays exposed.
    ddp = predict(BASE, Layout(dp=8), 256, hw, _basis(), backend="torch_ddp")
    assert ddp.comm_exposed_s < expected


def test_synchronised_ranks_wait_for_each_others_interruptions():
    # Once a step (a data-parallel all-reduce): the longest of dp, H_dp; every layer (tp, FSDP): each in turn.
    assert sync_factor(Layout()) == 1 and sync_factor(Layout(pp=2, micro_batches=4)) == 1
    assert sync_factor(Layout(dp=2)) == pytest.approx(1.5) and sync_factor(Layout(dp=4)) == pytest.approx(25 / 12)
    assert sync_factor(Layout(tp=2)) == 2 and sync_factor(Layout(fsdp=2)) == 2
    assert sync_factor(Layout(dp=2, tp=2)) == pytest.approx(3)
    # A 1-device run whose steps took 1, 1, 1, 1 and 2 s lost 0.2 of its 1.2 s mean to interruptions.
    assert interruption_share({"step_times_s": [1, 1, 1, 1, 2]}) == pytest.approx(0.2 / 1.2)
    assert interruption_share({"step_times_s": [1, 2]}) == 0.0   # too few steps to say
    cpu = hardware_files.load("cpu-loopback-2core")
    quiet = predict(TINY, Layout(dp=2), 32, cpu, _basis())
    noisy = predict(TINY, Layout(dp=2), 32, cpu, _basis(interruption_share=0.1))
    assert noisy.step_s == pytest.approx(quiet.step_s * (1 + 0.1 * 0.5))
    assert predict(TINY, Layout(), 32, cpu, _basis(interruption_share=0.1)).step_s == \
        pytest.approx(predict(TINY, Layout(), 32, cpu, _basis()).step_s)
    # A GPU's queued kernels run on through its host's interruptions: no wait is added there.
    gpu = hardware_files.load("h100-sxm-8")
    assert predict(BASE, Layout(dp=8), 256, gpu, _basis(interruption_share=0.1)).step_s == \
        pytest.approx(predict(BASE, Layout(dp=8), 256, gpu, _basis()).step_s)


def test_other_programs_load_is_the_busy_cores_less_the_runs_own():
    # 2 s on a 2-CPU machine: 400 ticks, 100 idle (1.5 cores busy), of which the run used 2 CPU-seconds (1 core).
    before = {"loadavg_1m": 1.0, "wall_s": 10.0, "own_cpu_s": 5.0, "cpu_total_ticks": 1000, "cpu_steal_ticks": 0,
              "cpu_idle_ticks": 500}
    after = {"loadavg_1m": 2.0, "wall_s": 12.0, "own_cpu_s": 7.0, "cpu_total_ticks": 1400, "cpu_steal_ticks": 0,
             "cpu_idle_ticks": 600}
    cpus = os.cpu_count()
    assert load_over(before, after)["other_busy_cores"] == pytest.approx(max(0.0, 0.75 * cpus - 1.0), abs=0.01)
    record = {"device_kind": "cpu", "devices": 2, "threads_per_device": 1,
              "load": {"loadavg_1m_after": 5.0, "other_busy_cores": 0.3}}
    assert background_load(record) == 0.3   # measured over the run, not the load average's minute
    assert background_load({**record, "load": {"loadavg_1m_after": 5.0}}) == 3.0


def test_assumed_mfu_is_labelled_and_uses_the_datasheet_peak():
    hw = hardware_files.load("h100-sxm-8")
    basis = from_mfu(0.5, hw, "amp")
    assert basis.assumed and "ASSUMED" in basis.label
    # 6 FLOPs per multiply-add at half of 989.5 TFLOP/s (bf16, dense).
    assert basis.s_per_mac_sample == pytest.approx(6 / (0.5 * 989.5e12))
    # A measured achievable peak (a run's achievable_peak) replaces the datasheet's.
    measured = from_mfu(0.5, hw, "amp", achievable=700e12)
    assert measured.s_per_mac_sample == pytest.approx(6 / (0.5 * 700e12)) and "measured achievable" in measured.label


def test_layout_names_at_a_device_count():
    assert Layout.parse("dp", 8) == Layout(dp=8)
    assert Layout.parse("fsdp", 64) == Layout(fsdp=64)
    assert Layout.parse("tp2xdp", 8) == Layout(dp=4, tp=2)
    assert Layout.parse("pp4-1f1b", 8) == Layout(dp=2, pp=4, micro_batches=8, schedule="1f1b")
    with pytest.raises(ValueError, match="uses 32 devices, not 8"):
        Layout.parse("tp8xpp4", 8)
    with pytest.raises(ValueError, match="do not divide them"):
        Layout.parse("tp3xdp", 8)
    with pytest.raises(ValueError, match="uses 4 devices"):
        Layout.parse("dp2xtp2", 8)
    check_name("tp2xfsdp-rc")
    with pytest.raises(ValueError, match="unknown option"):
        check_name("dp-fast")


def test_hardware_files_load_and_a_bad_one_is_one_line(tmp_path):
    for name in hardware_files.available():
        hw = hardware_files.load(name)
        assert hw.links and hw.memory_bytes > 0 and hw.sources
    bad = tmp_path / "mine.toml"
    bad.write_text('name = "mine"\n')
    with pytest.raises(ValueError) as err:
        hardware_files.load(str(bad))
    assert "\n" not in str(err.value) and "mine.toml" in str(err.value)


# ----------------------------------------------------------------------------- a real sweep

@pytest.fixture(scope="module")
def sweep(tmp_path_factory, layout_sweep):
    """The records of the session's layout sweep (conftest.LAYOUT_SWEEP: dp2 and tp2 of the tiny MLM and their
    1-device run), copied into a folder of this module's own: predict and report write beside them."""
    proc, out = layout_sweep
    assert proc.returncode == 0, proc.stderr[-2000:]
    mine = tmp_path_factory.mktemp("predict") / "results"
    shutil.copytree(out / "runs", mine / "runs")
    return mine


@pytest.mark.e2e
def test_validate_predicts_each_run_of_a_real_sweep(sweep, layout_sweep, capsys):
    layout_sweep_out = layout_sweep[1]
    assert predict_cli.main(["--validate", str(sweep)]) == 0
    printed = capsys.readouterr().out
    validation = json.loads((sweep / "validation.json").read_text())
    runs = {r["layout"]: r for r in validation["runs"]}
    assert set(runs) == {"dp2", "tp2"} and not validation["skipped"]
    for r in runs.values():
        assert r["state_bytes_per_rank"]["exact"] is True, r["state_bytes_per_rank"]
        # The formulas' collectives are the ones torch_3d counted, bytes and calls.
        assert all(v["predicted"] == v["measured"] for v in r["comm_per_step"].values()), r["comm_per_step"]
        assert r["step_s"]["predicted"] > 0 and r["step_s"]["measured"] > 0
        assert math.isfinite(r["step_s"]["error"]) and math.isfinite(r["memory_per_rank"]["error"])
        assert len(r["references"]) >= 1
    # --co-run-probe: the 1-device run's command again as two processes at once, their records under co-run/
    # (no reference of their own), their slowdown in the reference's record and in every prediction from it.
    reference = next(r for r in load_records(sweep) if r["devices"] == 1)
    probe = CoRun.from_record(reference)
    copies = list((layout_sweep_out / "co-run" / reference["run_id"]).glob("*/runs/*.json"))
    assert probe.processes == len(copies) == 2 and sorted(probe.run_ids) == sorted(p.stem for p in copies)
    assert probe.slowdown == pytest.approx(statistics.median(probe.step_s_p50) / reference["step_time_s"]["p50"])
    for r in runs.values():
        assert any(f"side by side x{probe.slowdown:.3f}" in note for note in r["notes"]), r["notes"]
    summary = validation["summary"]["all"]
    assert summary["step_s"]["runs"] == 2 and summary["state_bytes_exact"] == 2
    # The summary is of the rows (its error bound is held on a known answer: test_validation_of_runs_whose_step_...)
    errors = sorted(abs(r["step_s"]["error"]) for r in runs.values())
    assert (summary["step_s"]["max_abs_error"], summary["step_s"]["median_abs_error"]) == \
        (errors[-1], pytest.approx(sum(errors) / 2))
    assert "step time median |error|" in printed
    # The sweep's 1-device run had no --breakdown-steps probe: every row says its basis guessed the split.
    assert all(r["basis_guesses"] for r in runs.values()) and summary["resting_on_a_guess"] == 2
    assert "2 of 2 predictions rest on a GUESSED split" in printed and "--breakdown-steps 2" in printed
    # The report shows the table; a prediction quotes the error it rests on.
    assert report_main(["--results", str(sweep)]) == 0
    assert "Prediction against measurement" in (sweep / "report.md").read_text()
    assert predict_cli.main(["--from", str(sweep), "--hardware", "cpu-loopback-2core", "--devices", "2,4",
                             "--layouts", "dp,tp2xdp", "--model-size", "tiny"]) == 0
    table = json.loads((sweep / "predict-mlm-tiny-cpu-loopback-2core.json").read_text())
    assert "step time median |error|" in table["validation"] and not table["assumed"]
    assert {r["devices"] for r in table["rows"]} == {2, 4}
    assert (sweep / "plots" / "predict-mlm-tiny-cpu-loopback-2core.png").stat().st_size > 0


@pytest.mark.e2e
def test_a_gpu_cluster_from_cpu_records_is_refused_in_one_line(sweep):
    before = sorted(p.name for p in sweep.rglob("*"))
    proc = run_cli("bench.predict", "--from", str(sweep), "--hardware", "h100-sxm-8", "--model-size", "base")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--assume-mfu" in proc.stderr and "cpu" in proc.stderr
    assert sorted(p.name for p in sweep.rglob("*")) == before
    assert load_records(sweep)


def test_a_rank_beyond_the_device_memory_does_not_fit_and_fsdp_shrinks_it():
    hw = replace(hardware_files.load("h100-sxm-8"), memory_bytes=1.5 * 2**30)
    basis = from_mfu(0.4, hw, "amp")
    dp = predict(BASE, Layout(dp=8), 256, hw, basis)
    fsdp = predict(BASE, Layout(fsdp=8), 256, hw, basis)
    # BERT-base's 110M float32 parameters with gradients and AdamW moments: 16 bytes each, 1.6 GiB per replica.
    assert max(s.total for s in dp.state_per_rank) > 1.6 * 2**30 and not dp.fits(hw.memory_bytes)
    assert max(s.total for s in fsdp.state_per_rank) < 0.25 * 2**30 and fsdp.fits(hw.memory_bytes)


def test_memory_figures_come_from_the_memory_section_one_per_process():
    older = {"devices": 2, "peak_memory_per_rank": [100, 120]}
    assert measured_memory(older, "process_peak_per_rank") == [100, 120]
    assert measured_memory(older, "training_per_rank") == [None]
    shared = {"devices": 4, "peak_memory_per_rank": [999], "memory": {
        "process_peak_per_rank": [800], "training_per_rank": [400], "method": "m", "processes_share": True}}
    assert measured_memory(shared, "process_peak_per_rank") == [800]
    assert measured_memory(shared, "training_per_rank") == [400]
    # One process driving 4 devices holds the framework's overhead once and every device's share.
    assert per_process([1, 2, 3, 4], 1, 10) == [20]
    assert per_process([1, 2, 3, 4], 2, 10) == [13, 17]
    assert per_process([1, 2, 3, 4], 4, 10) == [11, 12, 13, 14] and per_process([1, 2], 0, 10) == [13]


# ----------------------------------------------------------------------------- the H100 reference

H100_RUNS = Path(__file__).resolve().parents[1] / "results" / "reference" / "h100x1"


def test_the_h100_basis_is_the_plain_run_of_the_batch_asked_for(tmp_path, capsys):
    """results/reference/h100x1 holds BERT-base 1-device runs on one H100 at several batches, with --recompute,
    in fp32 and by torch_ddp: a prediction takes torch_3d's plain amp run of the per-device batch asked for
    and the same batch at another micro-batch count, never the recompute run (the folder's latest at 32)."""
    hw = hardware_files.load("h100-sxm-8")
    ids = lambda basis: [i.rsplit("-", 1)[1] for i in basis.record_ids]  # noqa: E731
    basis, main, _ = predict_cli.measured_basis(H100_RUNS, hw, "mlm", "base", "amp", 32)
    assert ids(basis) == ["8f7ccb", "80a9cd"] and main["backend"] == "torch_3d"
    basis, main, _ = predict_cli.measured_basis(H100_RUNS, hw, "mlm", "base", "amp", 256)
    assert ids(basis) == ["e79003", "3802b5"] and basis.s_per_micro_batch > 0
    fp32, _, _ = predict_cli.measured_basis(H100_RUNS, hw, "mlm", "base", "fp32", 32)
    assert ids(fp32) == ["71a4f0"]
    # Batch 200 was not measured: the nearest (256) is, and the table says it scaled.
    assert predict_cli.main(["--from", str(H100_RUNS), "--hardware", "h100-sxm-8", "--devices", "8,64",
                             "--layouts", "dp,fsdp,tp2xdp,pp4-1f1b", "--batch-size", "200",
                             "--out", str(tmp_path)]) == 0
    table = json.loads((tmp_path / "predict-mlm-base-h100-sxm-8.json").read_text())
    assert "e79003" in table["compute"] and "predicted at 200 per device" in table["compute"]
    rows = {(r["layout"], r["devices"]): r for r in table["rows"]}
    assert rows[("dp", 8)]["global_batch"] == 1600 and rows[("pp4-1f1b", 64)]["layout_full"].startswith("dp16")
    # Data parallel on one node: the step is the measured one's (scaled to 200) plus an all-reduce over NVLink.
    assert 0.8 < rows[("dp", 8)]["efficiency"] <= 1.0


def test_a_basis_without_the_breakdown_probe_says_it_guessed_and_how_to_measure(tmp_path, capsys):
    """The split of a 1-device step into forward+backward, optimizer and the rest comes from its --breakdown-steps
    probe; without it the whole step is taken as forward+backward, and every table built on it says so."""
    hw = hardware_files.load("h100-sxm-8")
    measured, main, _ = predict_cli.measured_basis(H100_RUNS, hw, "mlm", "base", "amp", 32)
    assert measured.guesses == () and "GUESSED" not in measured.label and measured.s_per_param > 0
    stripped = json.loads(json.dumps(main))
    del stripped["backend_metrics"]["breakdown"]
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "a.json").write_text(json.dumps(stripped))
    guessed, _, _ = predict_cli.measured_basis(tmp_path, hw, "mlm", "base", "amp", 32)
    assert guessed.guesses == (UNPROBED.format(run_id=main["run_id"]),) and "GUESSED" in guessed.label
    assert guessed.s_per_param == 0 and guessed.s_per_step == 0
    assert predict_cli.main(["--from", str(tmp_path), "--hardware", "h100-sxm-8", "--devices", "8",
                             "--layouts", "dp", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "GUESSED" in printed and "--breakdown-steps 2" in printed
    assert "GUESSED" in json.loads((tmp_path / "predict-mlm-base-h100-sxm-8.json").read_text())["compute"]


def test_a_predicted_pipeline_places_its_layers_as_torch_3d_would():
    """--stage-split in a layout name: mini BERT's auto split at pp2 is 3 + 1 (its head weighs about 1.6 layers,
    docs/layouts.md: Stage split), even is 2 + 2, counts are taken as given; the busier last stage sets the step."""
    hw = hardware_files.load("h100-sxm-8")
    basis, mini = from_mfu(0.4, hw, "amp"), BERT_SIZES["mini"]
    rows = {name: predict_cli._row(mini, name, 2, 64, 32, basis, hw, "torch_3d", None, 1.0)
            for name in ("pp2-nmb4-1f1b", "pp2-nmb4-1f1b-splitauto", "pp2-nmb4-1f1b-split1+3")}
    assert [rows[n]["layers_per_stage"] for n in rows] == [[2, 2], [3, 1], [1, 3]]
    assert rows["pp2-nmb4-1f1b-splitauto"]["step_s"] < rows["pp2-nmb4-1f1b"]["step_s"] < \
        rows["pp2-nmb4-1f1b-split1+3"]["step_s"]


def test_bench_predict_s_defaults_are_the_documented_ones():
    # As --help says: BERT base at amp on 8, 64 and 512 devices; no hardware but --validate's; Megatron's stack.
    args = predict_cli.build_parser().parse_args([])
    assert (args.hardware, args.source, args.assume_mfu, args.workload, args.model_size, args.precision) == \
        (None, None, None, "mlm", "base", "amp")
    assert (args.devices, args.model, args.stack, args.layouts) == \
        ([8, 64, 512], None, "megatron-te", "dp,fsdp,tp2xdp,tp8xdp,pp4-1f1b")


def test_the_prediction_figure_draws_each_layout_and_marks_what_does_not_fit():
    """bench.predict's figure, read back from matplotlib: throughput (log) and memory per rank (GiB) side by side,
    one line per layout in one colour on both, a hollow point where a prediction does not fit, the device's memory
    as a black line with the red band above it to 1.5x that memory (or 1.1x the largest prediction)."""
    from matplotlib.colors import to_rgba

    from bench.reporting.prediction_plot import GIB, prediction_plot

    rows = [{"layout": "pp128", "devices": 8, "invalid": "more stages than layers"},     # nothing to draw: skipped
            {"layout": "dp", "devices": 8, "samples_per_s": 800.0, "memory_per_rank_max": 10 * GIB, "fits": True},
            {"layout": "dp", "devices": 64, "samples_per_s": 6000.0, "memory_per_rank_max": 90 * GIB, "fits": False},
            {"layout": "tp8", "devices": 8, "samples_per_s": 500.0, "memory_per_rank_max": 4 * GIB, "fits": True},
            {"layout": "tp8", "devices": 64, "invalid": "does not divide"}]
    caption = " ".join(["abcdefgh"] * 30)     # 18 of these words are 161 characters: one more than a line holds
    plot = prediction_plot(rows, 80 * GIB, "T", caption, "predict-x")
    assert (plot.slug, plot.title, plot.caption) == ("predict-x", "T", caption)
    assert plot.data == {"dp": [(8, 800.0, 10 * GIB, True), (64, 6000.0, 90 * GIB, False)],
                         "tp8": [(8, 500.0, 4 * GIB, True)]}
    fig = plot.figure
    assert tuple(fig.get_size_inches()) == (12, 6) and fig.get_layout_engine() is not None
    assert fig._suptitle.get_text() == "T\n" + " ".join(["abcdefgh"] * 17) + "\n" + " ".join(["abcdefgh"] * 13)
    assert fig._suptitle.get_fontsize() == pytest.approx(matplotlib_small())
    speed, memory = fig.axes
    assert [ax.get_subplotspec().get_geometry()[:2] for ax in (speed, memory)] == [(1, 2), (1, 2)]
    assert [ax.get_subplotspec().colspan.start for ax in (speed, memory)] == [0, 1]
    assert speed.get_yscale() == "log" and speed.get_ylabel() == "predicted samples/s, all devices"
    assert memory.get_ylabel() == "predicted memory per rank, most loaded (GiB)"
    for ax in (speed, memory):
        assert all(line.get_visible() and line.get_alpha() == 0.3 for line in ax.get_ygridlines())
    lines = {line.get_label(): line for line in speed.get_lines()}
    assert set(lines) == {"dp", "tp8"}
    assert list(lines["dp"].get_xdata()) == [8, 64] and list(lines["dp"].get_ydata()) == [800.0, 6000.0]
    mem_dp, mem_tp, limit = memory.get_lines()
    assert list(mem_dp.get_ydata()) == [10, 90] and list(mem_tp.get_ydata()) == [4]
    assert list(mem_dp.get_xdata()) == [8, 64]
    for name, on_memory in (("dp", mem_dp), ("tp8", mem_tp)):
        assert lines[name].get_marker() == on_memory.get_marker() == "o"
        assert on_memory.get_color() == lines[name].get_color()
    assert list(limit.get_ydata()) == [80, 80] and limit.get_color() == "black" and limit.get_linewidth() == 1
    # one hollow point on each panel, dp at 64 devices, ringed in dp's colour above the rest
    for ax, y in ((speed, 6000.0), (memory, 90.0)):
        [hollow] = [c for c in ax.collections if len(c.get_offsets())]
        assert [list(p) for p in hollow.get_offsets()] == [[64, y]] and list(hollow.get_sizes()) == [90]
        assert tuple(hollow.get_facecolors()[0]) == to_rgba("white")
        assert tuple(hollow.get_edgecolors()[0]) == to_rgba(lines["dp"].get_color()) and hollow.get_zorder() == 3
    [band] = [p for p in memory.patches]
    assert (band.get_y(), band.get_y() + band.get_height()) == (80, 120)      # matplotlib's axhspan: a Rectangle
    assert band.get_facecolor() == to_rgba("red", 0.08)
    assert band.get_label() == "does not fit (hollow points)" and memory.get_ylim() == (0, 120)
    assert speed.get_legend().get_title().get_text() == "layout"
    assert [t.get_text() for t in memory.get_legend().get_texts()] == ["does not fit (hollow points)"]
    assert memory.get_legend()._loc == 2    # upper left
    for legend in (speed.get_legend(), memory.get_legend()):
        assert all(t.get_fontsize() == pytest.approx(matplotlib_small()) for t in legend.get_texts())
    # a prediction past 1.5x the memory raises the band's top to 1.1x it
    rows[2]["memory_per_rank_max"] = 200 * GIB
    assert prediction_plot(rows, 80 * GIB, "T", "c", "s").figure.axes[1].get_ylim() == (0, pytest.approx(220))


def matplotlib_small() -> float:
    from matplotlib.font_manager import FontProperties

    return FontProperties(size="small").get_size_in_points()


# ----------------------------------------------------------------------------- --validate on records written here

def _runs_folder(path: Path, records: list[dict]) -> Path:
    (path / "runs").mkdir(parents=True)
    for r in records:
        (path / "runs" / f"{r['run_id']}.json").write_text(json.dumps(r))
    return path


def _printed_rows(text: str) -> list[list[str]]:
    """A printed table's rows, each cell's folded lines joined, all blanks left out (compare with _bare)."""
    from tests.test_plan_cli import _table
    return _bare(_table(text.splitlines())[1])


def _bare(rows: list[list[str]]) -> list[list[str]]:
    return [["".join(cell.split()) for cell in row] for row in rows]


def test_validate_writes_and_prints_the_validation_of_the_folder_s_records(tmp_path, capsys):
    """validation.json is common.predict.validation's answer for the folder on the hardware asked; the table is its
    rows, a run left out is named with why, and the summary line closes."""
    from tests.test_predict_validation import H100, _known_folder
    one, dp2 = _known_folder()[1:]
    records = [*_known_folder(), {**dp2, "run_id": "lone", "backend": "torch_ddp"}]
    results = _runs_folder(tmp_path / "results", records)
    assert predict_cli.main(["--validate", str(results), "--hardware", "h100-sxm-8"]) == 0
    written = json.loads((results / "validation.json").read_text())
    expected = validate(load_records(results), H100)
    assert written == json.loads(json.dumps(expected)) and [r["run_id"] for r in written["runs"]] == ["dp2", "dp4"]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].strip() == f"predicted vs measured, {results}"
    # 200 columns whatever the terminal (a log's width): the table's long notes fold to fill them.
    assert {len(line) for line in lines if line.startswith("│")} == {200}
    assert _printed_rows("\n".join(lines)) == _bare(validation_report.rows(expected))
    why = expected["skipped"][0]["why"]
    assert why.startswith("no ok 1-device run of its backend")
    closing = f"left out: lone: {why} {validation_report.summary_line(expected, str(results / 'validation.json'))}"
    assert " ".join("\n".join(lines).split()).endswith(" ".join(closing.split()))
    assert "each configuration's repeats" not in "\n".join(lines)


def test_validate_holds_repeats_as_one_configuration_on_this_vm_by_default(tmp_path, capsys):
    from tests.test_predict_validation import _known_folder, _repeat
    dp4, one, dp2 = _known_folder()
    repeats = [_repeat(dp2, "s", "4", 1.0), _repeat(dp2, "s", "5", 1.5), _repeat(one, "s", "1", 1.0)]
    results = _runs_folder(tmp_path / "results", [*repeats, {**one, "device_kind": "cpu", "run_id": "cpu-one"},
                                                  {**dp2, "device_kind": "cpu", "run_id": "cpu-dp2"}])
    assert predict_cli.main(["--validate", str(results)]) == 0
    expected = validate(load_records(results), hardware_files.load("cpu-loopback-2core"))
    assert json.loads((results / "validation.json").read_text()) == json.loads(json.dumps(expected))
    assert expected != validate(load_records(results), hardware_files.load("h100-sxm-8"))
    printed = capsys.readouterr().out
    assert validation_report.repeated(expected) and "each configuration's repeats as one (medians)" in printed
    assert _bare(validation_report.config_rows(expected))[0] in _printed_rows(printed)
    assert "left out" not in printed


def test_validate_refuses_a_folder_without_runs_or_without_a_run_to_predict(tmp_path, capsys):
    from tests.test_predict_validation import _known_folder
    with pytest.raises(SystemExit) as exit_:
        predict_cli.main(["--validate", str(tmp_path)])
    assert exit_.value.code == 2 and capsys.readouterr().err == \
        f"bench.predict: error: --validate {tmp_path}: no runs/ folder of run records there\n"
    results = _runs_folder(tmp_path / "ones", [_known_folder()[1]])
    with pytest.raises(SystemExit):
        predict_cli.main(["--validate", str(results), "--hardware", "h100-sxm-8"])
    assert capsys.readouterr().err == \
        f"bench.predict: error: --validate {results}: no ok multi-device run to predict\n"
    assert not (results / "validation.json").exists()


def test_bench_predict_help_says_what_each_option_does(capsys, monkeypatch):
    from common.predict import decoder
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps at hyphens too: one line per option
    with pytest.raises(SystemExit) as exit_:
        predict_cli.main(["--help"])
    assert exit_.value.code == 0
    hardware, models = ", ".join(hardware_files.available()), ", ".join(decoder.available())
    stacks = ("llm-foundry,llm-foundry-triton,megatron-bridge-fp8-cs,megatron-te,olmo-core,olmo-core-float8,"
              "torch-compile,torch-compile-float8,torch-eager")
    assert " ".join(capsys.readouterr().out.split()) == " ".join(f"""
usage: bench.predict [-h] [--validate RESULTS] [--hardware NAME|FILE] [--from RESULTS] [--assume-mfu MFU]
 [--workload {{cnn,mlm,lm}}] [--model-size {{base,mini,small,tiny}}] [--model NAME|FILE]
 [--stack {{{stacks}}}]
 [--devices DEVICES] [--layouts LAYOUTS]
 [--batch-size B | --global-batch GLOBAL_BATCH] [--precision {{fp32,amp,fp16}}] [--out OUT] [--constants] [--published]
 [--json FILE]
python -m bench.predict --from RESULTS --hardware NAME|FILE --devices 8,64,512 --layouts dp,fsdp,tp2xdp,pp4-1f1b
 [--workload mlm] [--model-size base] [--batch-size B | --global-batch B] [--precision amp] [--assume-mfu 0.4]
 python -m bench.predict --validate RESULTS [--hardware NAME|FILE] python -m bench.predict --model llama3-8b
 --hardware h100-sxm-8 --devices 8,128 --layouts fsdp-sel (decoders) python -m bench.predict --constants | --published
 [--json FILE]
options:
  -h, --help show this help message and exit
  --validate RESULTS predict every multi-device run of RESULTS from its 1-device runs and link probes; print and
  write RESULTS/validation.json
  --hardware NAME|FILE a bundled description ({hardware}) or a TOML file of yours (common/predict/hardware/README.md);
  default cpu-loopback-2core with --validate, else none
  --from RESULTS results folder whose 1-device run on the --hardware's kind of device gives the compute
  --assume-mfu MFU compute at this fraction of the device's datasheet peak instead of a measured run (labelled as an
  assumption in every table and figure)
  --workload {{cnn,mlm,lm}} --model-size {{base,mini,small,tiny}}
  --devices DEVICES device counts (default 8,64,512)
  --layouts LAYOUTS layout names (docs/layouts.md); a bare dp or fsdp takes the devices the rest leave
  --batch-size B per-device batch at every device count (weak scaling; default: the workload's, 32 for the MLM); the
  compute comes from the measured 1-device run of the batch nearest it
  --global-batch GLOBAL_BATCH one global batch at every device count (strong scaling)
  --precision {{fp32,amp,fp16}} the precision predicted: the measured run's (default amp: bf16 autocast), with
  --assume-mfu the math mode whose peak the MFU is of
  --out OUT folder for the figure and predictions.json (default: --from's folder, else ./predictions)
decoder LLMs on GPU clusters, from a compute table (docs/prediction-at-scale.md):
  --model NAME|FILE a decoder LLM ({models}) or a TOML file of yours (common/predict/models/README.md)
  --stack {{{stacks}}}
  with --model: the software running the step (kernels, fusions, tensor-parallel overlap, optimizer)
  --constants print every constant the GPU-cluster model uses, with its source, and exit
  --published predict every published GPU-cluster result (common/predict/published/) and print predicted against
  published with the error
  --json FILE with --published: write the points and errors here""".split())


def _printed(show) -> str:
    from rich.console import Console
    console = Console(record=True, width=400)
    show(console)
    return console.export_text()


def test_the_prediction_table_prints_each_row_s_figures_and_the_best_fitting_layout_per_device_count():
    from tests.test_plan_cli import _table
    hw = hardware_files.load("h100-sxm-8")
    basis = replace(from_mfu(0.4, hw, "amp"), label="compute [bold]here", guesses=("g [bold]1", "g2"))
    gib = 2**30
    row = {"layout": "dp", "devices": 8, "layout_full": "dp8", "global_batch": 256, "step_s": 0.12345,
           "samples_per_s": 2073.6, "efficiency": 0.876, "memory_per_rank_max": 1.5 * gib, "fits": True,
           "comm_exposed_share": 0.254, "bubble_share": 0.0}
    rows = [row, {**row, "layout": "tp2xdp", "layout_full": "dp4xtp2", "samples_per_s": 3000.04, "fits": False,
                  "memory_per_rank_max": 1234.5 * gib, "efficiency": 1.0, "bubble_share": 0.125},
            {**row, "layout": "fsdp", "layout_full": "fsdp8", "samples_per_s": 2500.0},
            {"layout": "pp128", "devices": 8, "invalid": "more stages than layers"},
            {**row, "devices": 64, "layout_full": "dp64", "fits": False}]
    text = _printed(lambda c: predict_cli._print(c, rows, hw, basis, "rests on [this]", "a title", False))
    lines = text.splitlines()
    columns, body = _table(lines)
    assert lines[0].strip() == "a title" and "rests on [this]" in text
    assert columns == ["layout", "N", "as", "batch", "step (ms)", "samples/s", "efficiency", "memory/rank (GiB)",
                       "fits", "exposed comm", "bubble"]
    assert body == [["dp", "8", "dp8", "256", "123.5", "2,073.6", "0.88", "1.50", "yes", "25%", "0%"],
                    ["tp2xdp", "8", "dp4xtp2", "256", "123.5", "3,000.0", "1.00", "1,234.50", "NO", "25%", "12%"],
                    ["fsdp", "8", "fsdp8", "256", "123.5", "2,500.0", "0.88", "1.50", "yes", "25%", "0%"],
                    ["pp128", "8", "", "", "", "", "", "", "", "", "more stages than layers"],
                    ["dp", "64", "dp64", "256", "123.5", "2,073.6", "0.88", "1.50", "NO", "25%", "0%"]]
    # The fastest layout that fits: fsdp8 (dp4xtp2 is faster and does not fit); none of the 64's fits.
    assert lines[-4:] == ["best at 8 devices: fsdp8 (2,500.0 samples/s)", "best at 64 devices: no layout fits",
                          f"hardware: h100-sxm-8 ({hw.path}); compute: compute [bold]here",
                          f"GUESSED: g [bold]1; g2; {MEASURE_THE_SPLIT}"]
    decoder_rows = [{**row, "tokens_per_s_per_device": 12345.6}]
    for compute in (replace(basis, guesses=()), device_compute(hw)):   # a compute table guesses nothing
        text = _printed(lambda c, compute=compute: predict_cli._print(c, decoder_rows, hw, compute, "", "t", True))
        columns, body = _table(text.splitlines())
        assert columns[6] == "tokens/s/device" and body[0][6] == "12,346" and "GUESSED" not in text
    assert text.splitlines()[-1] == f"hardware: h100-sxm-8 ({hw.path}); compute: {compute_label(compute)}"


class _Figure:
    """prediction_plot stood in for (its drawing is test_the_prediction_figure_draws_...'s): what it was given."""

    def __init__(self):
        self.drawn = []

    def __call__(self, rows, memory_bytes, title, caption, slug):
        self.drawn.append((rows, memory_bytes, title, caption, slug))
        return self

    def png(self) -> bytes:
        return b"png"


def test_a_decoder_is_predicted_per_layout_and_device_count_from_the_compute_table(tmp_path, monkeypatch, capsys):
    from common.predict import decoder, stacks
    figure = _Figure()
    monkeypatch.setattr(predict_cli, "prediction_plot", figure)
    monkeypatch.chdir(tmp_path)
    assert predict_cli.main(["--model", "llama3-8b", "--hardware", "h100-sxm-8", "--devices", "8,16", "--layouts",
                             " fsdp, tp2xdp,tp2xfsdp-sp,,pp128", "--stack", "torch-eager", "--from", "elsewhere"]) == 0
    hw, spec, stack = hardware_files.load("h100-sxm-8"), decoder.load("llama3-8b"), stacks.load("torch-eager")
    compute = device_compute(hw)
    slug = "predict-llama3-8b-h100-sxm-8"
    table = json.loads((tmp_path / "predictions" / f"{slug}.json").read_text())
    rests_on = "Checked against published GPU-cluster results: python -m bench.predict --published " \
               "(docs/prediction-at-scale.md)."
    assert {k: v for k, v in table.items() if k != "rows"} == {
        "hardware": "h100-sxm-8", "hardware_file": hw.path, "compute": compute_label(compute), "assumed": False,
        "validation": rests_on, "model": "llama3-8b", "stack": "torch-eager"}
    assert (tmp_path / "predictions" / "plots" / f"{slug}.png").read_bytes() == b"png"
    rows = table["rows"]
    assert [(r["layout"], r["devices"]) for r in rows] == [(n, d) for d in (8, 16)
                                                           for n in ("fsdp", "tp2xdp", "tp2xfsdp-sp", "pp128")]
    # A decoder's batch is one sequence per data-parallel rank (4 of tp2xfsdp-sp's 8); pp128 is more stages than
    # llama3-8b has layers, and torchtitan replicates with DDP only alone.
    invalid = {(r["layout"], r["devices"]): r["invalid"] for r in rows if "invalid" in r}
    assert set(invalid) == {(n, d) for d in (8, 16) for n in ("tp2xdp", "pp128")}
    assert "torch-eager does not run it" in invalid[("tp2xdp", 8)] and "pp128" in invalid[("pp128", 16)]
    for r in rows:
        if "invalid" in r:
            continue
        layout = Layout.parse(r["layout"], r["devices"])
        p = predict(spec, layout, layout.data, hw, compute, "", stack=stack)
        assert (r["layout_full"], r["global_batch"]) == (layout.name, layout.data)
        assert r["step_s"] == pytest.approx(p.step_s) and r["tokens_per_s_per_device"] == pytest.approx(
            p.tokens_per_s / r["devices"])
        assert "efficiency" not in r and "state_per_rank_max" not in r
    assert [r["global_batch"] for r in rows if r["layout"] == "tp2xfsdp-sp"] == [4, 8]
    title = f"llama3-8b on h100-sxm-8 (torch-eager): predicted per layout\n{compute_label(compute)}"
    assert [d[1:] for d in figure.drawn] == [(hw.memory_bytes, title, rests_on, slug)]
    assert json.loads(json.dumps(figure.drawn[0][0])) == rows
    printed = capsys.readouterr().out
    assert " ".join(printed.split()).endswith(f"figure: predictions/plots/{slug}.png; table: predictions/{slug}.json")
    assert "tokens/s/device" in printed and rests_on in " ".join(printed.split())   # the table's caption
    # At an assumed MFU: the datasheet peak's compute, so labelled.
    assert predict_cli.main(["--model", "llama3-8b", "--hardware", "h100-sxm-8", "--devices", "8", "--layouts", "tp8",
                             "--assume-mfu", "0.4"]) == 0
    table = json.loads((tmp_path / "predictions" / "predict-llama3-8b-h100-sxm-8.json").read_text())
    assumed = device_compute(hw, 0.4)
    assert (table["compute"], table["assumed"], table["stack"]) == (compute_label(assumed), True, "megatron-te")
    layout = Layout.parse("tp8", 8)
    assert table["rows"][0]["step_s"] == pytest.approx(predict(spec, layout, 1, hw, assumed, "",
                                                               stack=stacks.load("megatron-te")).step_s)


def test_an_executed_workload_at_an_assumed_mfu_is_labelled_unvalidated_and_assumed(tmp_path, monkeypatch):
    figure = _Figure()
    monkeypatch.setattr(predict_cli, "prediction_plot", figure)
    out = tmp_path / "out"
    assert predict_cli.main(["--hardware", "h100-sxm-8", "--assume-mfu", "0.4", "--devices", "2,4", "--layouts",
                             "dp,tp2xdp,pp2-nmb4", "--model-size", "tiny", "--global-batch", "64", "--out",
                             str(out)]) == 0
    table = json.loads((out / "predict-mlm-tiny-h100-sxm-8.json").read_text())
    hw = hardware_files.load("h100-sxm-8")
    basis = from_mfu(0.4, hw, "amp")
    assert (table["workload"], table["model_size"], table["assumed"], table["compute"]) == \
        ("mlm", "tiny", True, basis.label)
    assert table["validation"] == "Not validated: no results folder given (--from). The compute is ASSUMED " \
        "(--assume-mfu), not measured: the validation does not cover it."
    for r in table["rows"]:
        n = r["devices"]
        # Strong scaling: 64 in all at every count, each count's efficiency against one device's share of it.
        one = predict(TINY, Layout(), 64 / n, hw, basis, "torch_3d").samples_per_s
        p = predict(TINY, Layout.parse(r["layout"], n), 64, hw, basis, "torch_3d")
        assert r["global_batch"] == 64 and r["efficiency"] == pytest.approx(p.samples_per_s / (n * one))
        assert r == json.loads(json.dumps({
            "layout": r["layout"], "devices": n, "global_batch": 64, "layout_full": Layout.parse(r["layout"], n).name,
            "step_s": p.step_s, "samples_per_s": p.samples_per_s, "memory_per_rank_max": p.memory_max,
            "fits": p.fits(hw.memory_bytes), "comm_exposed_share": p.comm_exposed_s / p.step_s,
            "bubble_share": p.bubble_s / p.step_s, "parts_s": p.parts_s,
            "collectives": [asdict(c) for c in p.collectives], "notes": p.notes,
            "efficiency": r["efficiency"], "state_per_rank_max": max(s.total for s in p.state_per_rank),
            **({"layers_per_stage": [1, 1]} if r["layout"] == "pp2-nmb4" else {})}))
    assert [(r["layout"], r["devices"]) for r in table["rows"]] == [(n, d) for d in (2, 4)
                                                                      for n in ("dp", "tp2xdp", "pp2-nmb4")]
    pipeline = table["rows"][2]
    assert pipeline["bubble_share"] > 0 and pipeline["comm_exposed_share"] > 0 and pipeline["fits"]
    assert figure.drawn[0][2] == f"mlm-tiny on h100-sxm-8: predicted per layout\n{basis.label}"


def test_a_measured_run_unlike_the_prediction_says_how_it_differs_and_whether_it_was_validated(tmp_path,
                                                                                               monkeypatch):
    """The folder's one run: the tiny MLM at fp32, batch 32, on this VM's CPU; predicted: mini at amp, 16 per
    device, so the label names all three differences; the folder has no validation.json until it is given one."""
    from tests.test_predict_validation import _record
    monkeypatch.setattr(predict_cli, "prediction_plot", _Figure())
    results = _runs_folder(tmp_path / "results", [_record("one", 1, 32)])
    argv = ["--from", str(results), "--hardware", "cpu-loopback-2core", "--devices", "2", "--layouts", "dp",
            "--model-size", "mini", "--precision", "amp", "--batch-size", "16"]
    assert predict_cli.main(argv) == 0
    table = json.loads((results / "predict-mlm-mini-cpu-loopback-2core.json").read_text())
    basis, main, _ = predict_cli.measured_basis(results, hardware_files.load("cpu-loopback-2core"), "mlm", "mini",
                                                "amp", 16)
    assert main["run_id"] == "one" and not table["assumed"]
    assert table["compute"] == basis.label + "; measured at fp32, not amp (none of that precision); measured at " \
        "batch 32, predicted at 16 per device by multiply-adds (an assumption: pass --batch-size to use a measured " \
        "one); measured at size tiny, scaled to mini by multiply-adds (an assumption)"
    assert table["validation"] == f"Not validated: no validation.json in {results} (run bench.predict --validate " \
        f"{results})."
    assert table["rows"][0]["global_batch"] == 32   # 16 on each of 2
    # Asked as measured (tiny, fp32, its batch of 32): nothing to say; a validation.json is quoted.
    validation = validate(load_records(results), hardware_files.load("cpu-loopback-2core"))
    (results / "validation.json").write_text(json.dumps(validation))
    assert predict_cli.main(argv[:-6] + ["--model-size", "tiny", "--precision", "fp32"]) == 0
    table = json.loads((results / "predict-mlm-tiny-cpu-loopback-2core.json").read_text())
    assert table["compute"] == predict_cli.measured_basis(results, hardware_files.load("cpu-loopback-2core"), "mlm",
                                                          "tiny", "fp32", 32)[0].label
    assert table["validation"] == validation_report.summary_line(validation, str(results / "validation.json"))


@pytest.mark.parametrize("argv, says", [
    (["--devices", "8"], "--hardware is needed to predict (or --validate RESULTS)"),
    (["--hardware", "h100-sxm-8"], "give --from RESULTS (a measured 1-device run) or --assume-mfu MFU"),
    (["--model", "llama3-8b", "--hardware", "h100-sxm-8", "--precision", "fp32"],
     "--model predicts bf16 mixed precision (--precision amp), not fp32: fp32 is not modelled, fp8 is a stack's "
     "(--stack torch-compile-float8)"),
    (["--model", "llama3-8b", "--hardware", "h100-sxm-8", "--precision", "fp16"],
     "--model predicts bf16 mixed precision (--precision amp), not fp16: fp32 is not modelled, fp8 is a stack's "
     "(--stack torch-compile-float8)"),
    (["--hardware", "h100-sxm-8", "--assume-mfu", "0.4", "--layouts", "dp,dp-fast"], None),
])
def test_what_cannot_be_predicted_is_refused_in_one_line(argv, says, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(predict_cli, "prediction_plot", _Figure())
    with pytest.raises(SystemExit) as exit_:
        predict_cli.main(argv + ["--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("bench.predict: error: ")
    if says:
        assert err == f"bench.predict: error: {says}\n"
    assert list(tmp_path.iterdir()) == []   # a layout no count can lay out is refused before anything is predicted


def test_strong_scaling_takes_the_measured_batch_nearest_the_smallest_count_s_share_and_says_nothing_of_it(
        tmp_path, monkeypatch):
    """--global-batch 64 on 2 and 4 devices: the 1-device run of 32 (64 over the smallest count), not of 16; each
    count runs the batch given, so no batch is scaled and the label says none was."""
    from tests.test_predict_validation import _record
    monkeypatch.setattr(predict_cli, "prediction_plot", _Figure())
    results = _runs_folder(tmp_path / "results", [_record("of16", 1, 16), _record("of32", 1, 32)])
    assert predict_cli.main(["--from", str(results), "--hardware", "cpu-loopback-2core", "--devices", "4,2",
                             "--layouts", "dp", "--model-size", "tiny", "--precision", "fp32", "--global-batch",
                             "64"]) == 0
    table = json.loads((results / "predict-mlm-tiny-cpu-loopback-2core.json").read_text())
    basis, main, _ = predict_cli.measured_basis(results, hardware_files.load("cpu-loopback-2core"), "mlm", "tiny",
                                                "fp32", 32)
    assert main["run_id"] == "of32" and table["compute"] == basis.label and "batch" not in basis.label
    assert [r["global_batch"] for r in table["rows"]] == [64, 64]
    # On 4 and 8: the run of 16 (not the workload's 32 per device), and still nothing scaled to say.
    assert predict_cli.main(["--from", str(results), "--hardware", "cpu-loopback-2core", "--devices", "4,8",
                             "--layouts", "dp", "--model-size", "tiny", "--precision", "fp32", "--global-batch",
                             "64"]) == 0
    table = json.loads((results / "predict-mlm-tiny-cpu-loopback-2core.json").read_text())
    assert "of16" in table["compute"] and "batch" not in table["compute"]


def test_a_device_is_known_by_its_gpu_model_or_its_kind():
    assert predict_cli._kind("cuda", "NVIDIA H100 80GB HBM3") == "H100 SXM"
    assert predict_cli._kind("cuda", "Some GPU") == "cuda" and predict_cli._kind("cpu", "NVIDIA H100 80GB HBM3") == \
        "cpu"
    assert predict_cli._kind(None, None) == "None"
    of = predict_cli._device_kind_of
    assert of({"device_kind": "cuda", "host": {"gpus": ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"]}}) == "A100"
    assert of({"device_kind": "cuda", "host": None}) == of({"device_kind": "cuda", "host": {"gpus": []}}) == "cuda"
    assert of({"device_kind": "cpu"}) == "cpu"


def test_the_main_run_is_torch_3d_s_plain_run_of_the_size_precision_and_batch_asked_the_latest_among_equals(
        tmp_path):
    """Each candidate below differs from the wanted one (torch_3d, tiny, fp32, plain, no accumulation, batch 32) in
    one thing, and is chosen only once every better one is gone; the order is measured_basis's preference (a
    --recompute run and a compiled one are alike: the later first)."""
    from tests.test_predict_validation import _record
    cpu = hardware_files.load("cpu-loopback-2core")

    def run(run_id, started="2026-01-01T00:00:00", **changes):
        r = _record(run_id, 1, 32, started=started)
        config = changes.pop("config", {})
        return {**r, **changes, "config": {**r["config"], **config}}
    unstated = run("earlier")
    del unstated["config"]["precision"]   # fp32, as a record of before --precision says it
    ranked = [run("latest", "2026-01-02T00:00:00"), unstated,
              run("batch-48", global_batch=48), run("batch-12", global_batch=12),
              run("accumulating", config={"grad_accum": 2}),
              run("recomputing", "2026-01-01T00:00:01", layout={"dp": 1, "recompute": "full"}),
              run("compiled", config={"compile": "default"}), run("amp", config={"precision": "amp"}),
              run("mini", config={"model_size": "mini"}), run("ddp", backend="torch_ddp")]
    ignored = [run("failed", "2026-02-01", status="failed"), run("two", "2026-02-01", devices=2),
               run("cnn", "2026-02-01", workload="cnn"), run("unmeasured", "2026-02-01", step_time_s={}),
               run("gpu", "2026-02-01", device_kind="cuda")]
    for i, expected in enumerate(r["run_id"] for r in ranked):
        folder = tmp_path / str(i)
        _runs_folder(folder, ranked[i:] + ignored)
        assert predict_cli.measured_basis(folder, cpu, "mlm", "tiny", "fp32", 32)[1]["run_id"] == expected
    _runs_folder(tmp_path / "none", ignored)
    with pytest.raises(ValueError) as refused:
        predict_cli.measured_basis(tmp_path / "none", cpu, "mlm", "tiny", "fp32", 32)
    assert str(refused.value) == f"{tmp_path / 'none'} has no 1-device mlm run on cpu (its runs: cuda); compute " \
        "measured on one kind of device does not predict cpu-loopback-2core: pass --assume-mfu MFU to predict from " \
        "an assumed utilisation"
    _runs_folder(tmp_path / "two-kinds", [run("gpu", device_kind="cuda"), run("tpu", device_kind="tpu")])
    with pytest.raises(ValueError, match=r"no 1-device mlm run on cpu \(its runs: cuda, tpu\);"):
        predict_cli.measured_basis(tmp_path / "two-kinds", cpu, "mlm", "tiny", "fp32", 32)
    _runs_folder(tmp_path / "empty", [])
    with pytest.raises(ValueError, match=r"no 1-device cnn run on cpu \(its runs: none\)"):
        predict_cli.measured_basis(tmp_path / "empty", cpu, "cnn", "tiny", "fp32", 32)


def test_an_assumed_mfu_takes_the_latest_peak_measured_on_the_part_at_the_precision_asked(tmp_path):
    from types import SimpleNamespace

    from tests.test_predict_validation import _record
    hw = hardware_files.load("h100-sxm-8")

    def run(run_id, peak, started=None, gpu="NVIDIA H100 80GB HBM3", precision="fp32", status="ok"):
        r = _record(run_id, 1, 32)
        r.pop("started_at")
        return {**r, "status": status, "device_kind": "cuda", "host": {"name": "h", "gpus": [gpu]},
                "config": {**r["config"], "precision": precision}, **({"started_at": started} if started else {}),
                **({"achievable_peak": {"flops_per_s": peak}} if peak != "none" else {})}
    folder = _runs_folder(tmp_path / "r", [
        run("undated", 4e14), run("older", 6e14, "2026-01-01"), run("latest", 5e14, "2026-01-02"),
        run("failed", 7e14, "2026-01-03", status="failed"),
        run("a100", 8e14, "2026-01-04", gpu="NVIDIA A100-SXM4-80GB"),
        run("amp", 9e14, "2026-01-05", precision="amp"), run("unprobed", "none", "2026-01-06"),
        run("no-figure", None, "2026-01-07"), {**run("of-64", None, "2026-01-01"), "global_batch": 64}])
    args = SimpleNamespace(assume_mfu=0.5, precision="fp32", workload="mlm", model_size="tiny")
    assert predict_cli.chosen_basis(args, hw, folder, 32) == (from_mfu(0.5, hw, "fp32", 5e14), None, None)
    assert predict_cli.chosen_basis(args, hw, None, 32) == (from_mfu(0.5, hw, "fp32", None), None, None)
    # Without --assume-mfu: measured_basis's, of the workload, size, precision and batch asked.
    measured = predict_cli.chosen_basis(SimpleNamespace(**{**vars(args), "assume_mfu": None}), hw, folder, 32)
    assert measured[:2] == predict_cli.measured_basis(folder, hw, "mlm", "tiny", "fp32", 32)[:2]
    assert measured[1]["run_id"] == "no-figure"   # the latest plain run: a peak is not what it is chosen by


def test_the_label_says_nothing_of_a_run_measured_as_asked_and_a_share_is_whole_samples(tmp_path, monkeypatch):
    """A run at amp predicted at amp: no precision to name. --global-batch 64 over at least 3 devices: 21 samples
    each (not 21.3), nearer the run of 18 than the run of 25 (their geometric middle is 21.2)."""
    from tests.test_predict_validation import _record
    monkeypatch.setattr(predict_cli, "prediction_plot", _Figure())
    runs = [{**_record(f"of{b}", 1, b), "config": {"model_size": "tiny", "precision": "amp"}} for b in (18, 25)]
    results = _runs_folder(tmp_path / "results", runs)
    assert predict_cli.main(["--from", str(results), "--hardware", "cpu-loopback-2core", "--devices", "3,6",
                             "--layouts", "dp", "--model-size", "tiny", "--global-batch", "64"]) == 0
    compute = json.loads((results / "predict-mlm-tiny-cpu-loopback-2core.json").read_text())["compute"]
    assert "of18" in compute and "of25" not in compute and "measured at" not in compute


def test_a_run_of_before_precision_was_recorded_is_fp32_and_the_cnn_is_predicted_as_the_cnn(tmp_path, monkeypatch):
    from common.spec import CNN
    from tests.test_predict_validation import _record
    monkeypatch.setattr(predict_cli, "prediction_plot", _Figure())
    old = _record("old", 1, 32)
    del old["config"]["precision"]
    results = _runs_folder(tmp_path / "results", [old])
    assert predict_cli.main(["--from", str(results), "--hardware", "cpu-loopback-2core", "--devices", "2",
                             "--layouts", "dp", "--model-size", "tiny", "--precision", "fp32"]) == 0
    assert "measured at" not in json.loads((results / "predict-mlm-tiny-cpu-loopback-2core.json").read_text())[
        "compute"]
    hw = hardware_files.load("h100-sxm-8")
    assert predict_cli.main(["--hardware", "h100-sxm-8", "--assume-mfu", "0.4", "--workload", "cnn", "--devices", "2",
                             "--layouts", "dp", "--out", str(tmp_path)]) == 0
    [row] = json.loads((tmp_path / "predict-cnn-base-h100-sxm-8.json").read_text())["rows"]
    expected = predict(CNN, Layout(dp=2), row["global_batch"], hw, from_mfu(0.4, hw, "amp"), "torch_3d")
    assert row["step_s"] == pytest.approx(expected.step_s)
    assert predict_cli.main(["--hardware", "h100-sxm-8", "--assume-mfu", "0.4", "--model-size", "mini", "--devices",
                             "2", "--layouts", "dp", "--out", str(tmp_path)]) == 0
    [row] = json.loads((tmp_path / "predict-mlm-mini-h100-sxm-8.json").read_text())["rows"]
    mini = predict(BERT_SIZES["mini"], Layout(dp=2), row["global_batch"], hw, from_mfu(0.4, hw, "amp"), "torch_3d")
    assert row["step_s"] == pytest.approx(mini.step_s)


def test_weak_scaling_gives_every_device_the_workload_s_batch_whatever_the_layout(tmp_path, monkeypatch):
    """The MLM's 32 a device: 128 on 4 devices for dp and for tp2xdp alike (a decoder's batch is per data rank)."""
    monkeypatch.setattr(predict_cli, "prediction_plot", _Figure())
    assert predict_cli.main(["--hardware", "h100-sxm-8", "--assume-mfu", "0.4", "--model-size", "tiny", "--devices",
                             "4", "--layouts", "dp,tp2xdp", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "predict-mlm-tiny-h100-sxm-8.json").read_text())["rows"]
    assert [r["global_batch"] for r in rows] == [128, 128]


def test_a_folder_whose_1_device_run_is_ddp_s_is_predicted_as_ddp_runs_it(tmp_path, monkeypatch):
    """The main run is the backend the folder holds: with only torch_ddp's 1-device run, every layout is predicted
    as DDP runs it (base's 440 MB of gradients all-reduced in 25 MiB buckets during the backward), not as torch_3d
    would."""
    from tests.test_predict_validation import _record
    monkeypatch.setattr(predict_cli, "prediction_plot", _Figure())
    results = _runs_folder(tmp_path / "results", [_record("ddp", 1, 32, backend="torch_ddp")])
    assert predict_cli.main(["--from", str(results), "--hardware", "cpu-loopback-2core", "--devices", "2",
                             "--layouts", "dp", "--model-size", "base", "--batch-size", "32"]) == 0
    row = json.loads((results / "predict-mlm-base-cpu-loopback-2core.json").read_text())["rows"][0]
    hardware = hardware_files.load("cpu-loopback-2core")
    basis = predict_cli.measured_basis(results, hardware, "mlm", "base", "amp", 32)[0]
    spec, dp2 = BERT_SIZES["base"], Layout.parse("dp", 2)
    ddp, as_3d = (predict(spec, dp2, 64, hardware, basis, backend) for backend in ("torch_ddp", "torch_3d"))
    assert ddp.step_s != as_3d.step_s
    assert (row["step_s"], row["collectives"]) == (ddp.step_s, [asdict(c) for c in ddp.collectives])


def test_a_recomputing_layout_pays_its_layers_forward_again_in_launches_and_multiply_adds():
    """--recompute full on 1 device, tiny BERT at batch 8: the recomputed forward is the layers' forward share of
    forward+backward (1 - 2/3) of their multiply-adds, costed per launch (s_per_micro_batch against the whole
    model's forward multiply-adds) and per multiply-add and sample (s_per_mac_sample)."""
    from common.predict.executed import executed_stages
    from common.predict.gpu_compute import compute_for
    from common.predict.work import parts
    hw, tiny, full = hardware_files.load("cpu-loopback-2core"), BERT_SIZES["tiny"], Layout(recompute="full")
    whole = parts(tiny)
    layers = whole.layers * whole.layer
    launches = executed_stages(tiny, full, 8, hw, _basis(s_per_mac_sample=0.0, s_per_micro_batch=1.0))
    assert launches.recompute == [pytest.approx(layers / 3 / whole.total)]
    assert launches.compute == [pytest.approx(1 + layers / 3 / whole.total)]
    per_mac = executed_stages(tiny, full, 8, hw, _basis(s_per_mac_sample=1e-9))
    assert per_mac.recompute == [pytest.approx(1e-9 * layers / 3 * 8)]
    # a decoder is timed from a compute table (its kernels), never from a basis of an executed workload's run
    with pytest.raises(ValueError) as refused:
        executed_stages(BASE, Layout(), 8, hw, compute_for(hardware_files.load("h100-sxm-8")))
    assert str(refused.value) == "BertSpec: a compute table times a decoder's kernels; the executed workloads are " \
        "timed from a measured 1-device run or an assumed MFU (--from, --assume-mfu)"


def test_a_split_vocabulary_adds_the_embedding_s_and_the_split_loss_s_all_reduces_by_hand():
    """tiny BERT on tp2 with --vocab-split, one stage (the first and the last), batch 8 in bf16: per layer 2
    forward all-reduces of the bf16 hidden states and 2 backward of their float32 gradients; the row-wise
    embedding's float32 partial sums; the split loss's 3 float32 all-reduces and one of int64 indices over the
    8 x 20 gathered positions, and its head's gradient (float32 on CUDA, the activations' type on a CPU). Each on
    the critical path."""
    tiny = BERT_SIZES["tiny"]
    s, h, positions = tiny.seq_len, tiny.hidden, 8 * tiny.max_predictions
    lay = Layout(tp=2, vocab_split=True)
    expected = [("tensor-parallel activations", 2 * 8 * s * h, 2 * tiny.layers),
                ("tensor-parallel input gradients", 4 * 8 * s * h, 2 * tiny.layers),
                ("split embedding's partial sums", 4 * 8 * s * h, 1),
                ("split loss's maximum, sum of exponentials and target logit", 4 * positions, 3),
                ("split loss's index of the maximum (the correct count)", 8 * positions, 1),
                ("split loss's gradient of the head's output", 4 * positions * h, 1)]
    found = collectives(tiny, lay, 8, 0, "torch_3d", 2, "cuda")
    assert [(c.what, c.nbytes, c.calls, c.kind, c.dim, c.ranks, c.exposed) for c in found] == [
        (what, nbytes, calls, "all_reduce", "tp", 2, True) for what, nbytes, calls in expected]
    on_cpu = collectives(tiny, lay, 8, 0, "torch_3d", 2, "cpu")
    assert on_cpu[-1].nbytes == 2 * positions * h
    # a stage's collectives are those of its hardware's kind of device: an H100's head gradient is float32
    from common.predict.executed import executed_stages
    stages = executed_stages(tiny, lay, 8, hardware_files.load("h100-sxm-8"), _basis(precision="amp"))
    assert stages.collectives[0][-1].nbytes == 4 * positions * h
    stages = executed_stages(tiny, lay, 8, hardware_files.load("cpu-loopback-2core"), _basis(precision="amp"))
    assert stages.collectives[0][-1].nbytes == 2 * positions * h


def test_the_basis_is_the_main_run_s_own_model_and_each_layout_s_its_micro_batches_reference(tmp_path):
    """A folder of mini's 1-device runs, plain and accumulating 4: the basis divides the main run's step by mini's
    multiply-adds (not tiny's, the size a record without one is); a layout of 4 micro-batches is predicted from the
    run that accumulated 4, the plain one from the main run; a CNN run is timed as the CNN."""
    from common.predict.validation import basis_of
    from tests.test_predict_validation import _record
    cpu = hardware_files.load("cpu-loopback-2core")

    def mini(run_id, accumulation=1, step=1.0):
        r = _record(run_id, 1, 32, accumulation=accumulation)
        return {**r, "config": {**r["config"], "model_size": "mini"}, "step_time_s": {"p50": step}}
    plain, four = mini("plain"), mini("four", accumulation=4, step=1.5)
    folder = _runs_folder(tmp_path / "mini", [plain, four])
    basis, main, basis_for = predict_cli.measured_basis(folder, cpu, "mlm", "mini", "fp32", 32)
    assert main["run_id"] == "plain"
    assert basis.s_per_mac_sample == basis_of(BERT_SIZES["mini"], [plain, four], [plain, four]).s_per_mac_sample
    assert basis.s_per_mac_sample != basis_of(TINY, [plain, four], [plain, four]).s_per_mac_sample
    pipeline = Layout(pp=2, micro_batches=4)
    assert basis_for(pipeline) == basis_of(BERT_SIZES["mini"], [four, plain], [plain, four])
    assert basis_for(Layout(dp=2)) == basis_of(BERT_SIZES["mini"], [plain, four], [plain, four])
    # no plain run: the main one accumulates 2, yet a layout is matched by its own micro-batches alone (its run
    # has no accumulation of its own), so 4 micro-batches still take the run that accumulated 4
    two = {**mini("two", accumulation=2, step=1.2), "started_at": "2026-01-02T00:00:00"}
    basis_for = predict_cli.measured_basis(_runs_folder(tmp_path / "acc", [two, four]), cpu, "mlm", "mini", "fp32",
                                           32)[2]
    assert basis_for(pipeline) == basis_of(BERT_SIZES["mini"], [four, two], [two, four])
    cnn = {**_record("cnn", 1, 32), "workload": "cnn", "config": {"precision": "fp32", "grad_accum": 1}}
    cnn_basis = predict_cli.measured_basis(_runs_folder(tmp_path / "cnn", [cnn]), cpu, "cnn", "tiny", "fp32", 32)[0]
    assert cnn_basis == basis_of(model_spec("cnn", "tiny"), [cnn], [cnn])
