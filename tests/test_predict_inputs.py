"""What a prediction rests on, by hand: a hardware file read field by field, and the basis a 1-device record
gives (common.predict.hardware, common.predict.basis)."""
from __future__ import annotations

import pytest

from bench.co_run import processes
from common.layout import Layout
from common.predict import hardware as hardware_files
from common.predict.basis import (
    accumulation,
    background_load,
    co_run_slowdown,
    eval_batch,
    from_mfu,
    from_records,
    interruption_share,
    stage_split,
)
from common.predict.hardware import HARDWARE_DIR, Link
from common.predict.memory import stage_tensors, state_bytes
from common.predict.work import ComputeShares, parts
from common.sections import ATTRIBUTION_CATEGORIES
from common.spec import BERT_SIZES, DEFAULTS

TINY = BERT_SIZES["tiny"]
MINE = """
name = "mine"
description = "two boxes"
device_kind = "cuda"
device_name = "NVIDIA H100 80GB HBM3"
devices_per_node = 4
memory_GiB = 1.5
memory_GBps = 2000
comm_overlaps_compute = true
sources = ["a datasheet"]
achievable_TFLOPS = { bf16 = 600 }
[[link]]
level = "node"
busbw_GBps = 100
latency_us = 3
source = "measured"
[[link]]
level = "network"
busbw_GBps = 10
latency_us = 20
"""


def test_a_hardware_file_read_field_by_field(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(MINE)
    hw = hardware_files.load(str(path))
    assert (hw.name, hw.description, hw.device_kind, hw.device_name) == ("mine", "two boxes", "cuda",
                                                                           "NVIDIA H100 80GB HBM3")
    assert (hw.devices_per_node, hw.memory_bytes, hw.memory_GBps) == (4, 3 * 2**29, 2000.0)
    assert hw.comm_overlaps_compute is True and hw.sources == ("a datasheet",) and hw.path == str(path)
    assert hw.achievable_tflops == {"bf16": 600.0}
    assert hw.link(False) == Link("node", 100.0, pytest.approx(3e-6), "measured")
    assert hw.link(True) == Link("network", 10.0, pytest.approx(2e-5), "")
    bare = tmp_path / "bare.toml"
    bare.write_text("\n".join(line for line in MINE.splitlines() if not line.startswith(
        ("description", "device_name", "memory_GBps", "comm_overlaps", "sources", "achievable", "source"))))
    hw = hardware_files.load(str(bare))
    assert (hw.description, hw.device_name, hw.memory_GBps, hw.comm_overlaps_compute, hw.sources) == \
        ("", "", None, False, ())
    assert hw.achievable_tflops == {} and hw.link(False).source == ""
    assert (hw.compute, hw.compute_scale, hw.compute_scale_source) == ("", 1.0, "")   # no compute table named


def test_a_hardware_file_that_lacks_a_level_or_a_field_says_so_in_one_line(tmp_path):
    path = tmp_path / "one.toml"
    path.write_text(MINE.split("[[link]]\nlevel = \"network\"")[0])
    with pytest.raises(ValueError, match="hardware mine: no \\[\\[link\\]\\] of level 'network'"):
        hardware_files.load(str(path)).link(True)
    for broken, what in ((MINE.replace('devices_per_node = 4', ''), "KeyError: 'devices_per_node'"),
                         (MINE.replace("memory_GiB = 1.5", 'memory_GiB = "lots"'), "ValueError"),
                         (MINE + "[oops", "TOMLDecodeError")):
        path.write_text(broken)
        with pytest.raises(ValueError) as err:
            hardware_files.load(str(path))
        assert str(err.value).startswith(f"--hardware {path}: {what}") and "\n" not in str(err.value)
        assert f"(format: {HARDWARE_DIR}/README.md)" in str(err.value)
    with pytest.raises(ValueError, match=r"--hardware nowhere: no such file or bundled description \(bundled: "
                                         r"a100-sxm-8, .*h100-sxm-8"):
        hardware_files.load("nowhere")
    assert hardware_files.available() == sorted(p.stem for p in HARDWARE_DIR.glob("*.toml"))
    assert hardware_files.load("h100-sxm-8").path == str(HARDWARE_DIR / "h100-sxm-8.toml")


def _one(run_id="one", batch=32, accumulation_=1, step=1.0, breakdown=None, **extra) -> dict:
    metrics = {"breakdown": breakdown} if breakdown else {}
    return {"run_id": run_id, "status": "ok", "devices": 1, "global_batch": batch, "backend": "torch_3d",
            "workload": "mlm", "device_kind": "cpu", "threads_per_device": 2, "host": {"name": "h", "cores": 8},
            "config": {"model_size": "tiny", "precision": "fp32", "grad_accum": accumulation_},
            "layout": {"dp": 1}, "step_time_s": {"p50": step}, "backend_metrics": metrics, **extra}


def _breakdown(fb, grad_comm, optimizer, data, other) -> dict:
    return {"forward_backward_s": fb, "grad_comm_s": grad_comm, "optimizer_s": optimizer, "data_s": data,
            "other_s": other, "probe_step_s": 9.0, "step_s": 9.0, "source": "test", "probe_steps": 2}


def test_a_basis_from_one_record_by_hand():
    """The measured step split by its probe's shares: 60% forward+backward, 30% optimizer, 10% the rest (data,
    other and the gradients' communication); the probe's own durations (9 s) are never used."""
    record = _one(step=2.0, breakdown=_breakdown(1.2, 0.05, 0.6, 0.1, 0.05),
                  load={"other_busy_cores": 0.5}, step_times_s=[1.0, 1.0, 1.0, 1.0, 2.0])
    basis = from_records(TINY, [record])
    assert basis.s_per_mac_sample == pytest.approx(0.6 * 2.0 / (32 * parts(TINY).total))
    assert basis.s_per_micro_batch == 0.0
    assert basis.s_per_param == pytest.approx(0.3 * 2.0 / TINY.param_count())
    assert basis.s_per_step == pytest.approx(0.1 * 2.0)
    assert (basis.threads_per_device, basis.cores, basis.background) == (2, 8, 0.5)
    assert basis.interruption_share == pytest.approx(0.2 / 1.2) and basis.precision == "fp32"
    assert basis.record_ids == ("one",) and not basis.assumed
    assert basis.label == "compute measured: torch_3d 1-device run one (cpu)"
    assert basis.memory_overhead is None and basis.training_overhead is None  # no memory figure in the record
    # the optimizer's time per element it updates: the record's own count of them where it has one
    counted = _one(step=2.0, breakdown=_breakdown(1.2, 0.05, 0.6, 0.1, 0.05),
                   backend_metrics={"breakdown": _breakdown(1.2, 0.05, 0.6, 0.1, 0.05),
                                    "state_bytes_per_rank": [{"params": 400, "grads": 400, "optimizer": 800}]})
    assert from_records(TINY, [counted]).s_per_param == pytest.approx(0.3 * 2.0 / 100)
    # no probe: all forward+backward; a probe with nothing timed likewise
    assert from_records(TINY, [_one(step=2.0)]).s_per_step == 0.0
    assert from_records(TINY, [_one(step=2.0, breakdown=_breakdown(0, 0, 0, 0, 0))]).s_per_mac_sample == \
        pytest.approx(2.0 / (32 * parts(TINY).total))


def test_a_fixed_cost_per_micro_batch_from_two_accumulations_of_one_batch():
    """fb(K) = K c + B macs t: 1.0 s at K = 1 and 1.6 s at K = 4 give c = 0.2 s and 0.8 s of multiply-adds."""
    one, four = _one("k1", step=1.0), _one("k4", accumulation_=4, step=1.6)
    basis = from_records(TINY, [one, four])
    assert basis.s_per_micro_batch == pytest.approx(0.2)
    assert basis.s_per_mac_sample == pytest.approx(0.8 / (32 * parts(TINY).total))
    assert ", per-micro-batch cost from k4; GUESSED" in basis.label and basis.record_ids == ("k1", "k4")
    main_four = from_records(TINY, [four, one])  # the main run at K = 4: 1.6 - 4 x 0.2 of multiply-adds
    assert main_four.s_per_mac_sample == pytest.approx(0.8 / (32 * parts(TINY).total))
    assert from_records(TINY, [_one("a", step=1.6), _one("b", step=1.0)]).s_per_micro_batch == 0.0  # one K only
    assert from_records(TINY, [_one("k1", step=1.6), _one("k4", accumulation_=4, step=1.0)]).s_per_micro_batch == 0


def test_the_co_run_slowdown_comes_from_whichever_reference_carries_the_probe():
    probe = {"processes": 2, "step_s_p50": [1.03, 1.05], "slowdown": 1.04, "run_ids": ["c0", "c1"]}
    basis = from_records(TINY, [_one("k4", accumulation_=4, step=1.6), _one("k1", step=1.0, co_run=probe)])
    assert basis.co_run == 1.04 and "side by side x1.040 (co-run probe of k1)" in basis.label
    assert basis.label.startswith("compute measured: torch_3d 1-device run k4 (cpu), per-micro-batch cost from k1")
    assert co_run_slowdown([_one("k1")]) == (1.0, None) and from_records(TINY, [_one("k1")]).co_run == 1.0
    assert processes(2, 1, 4) == 2 and processes(8, 2, 2) == 2 and processes(16, 4, 8) == 4
    assert processes(2, 2, 2) == 0 and processes(8, 1, 1) == 0     # fewer than two fit, or no run of two
    # cores the record did not give count as one, threads per device as one; five cores of two threads hold two
    assert processes(None, 1, 4) == 0 and processes(4, None, 8) == 4 and processes(5, 2, 4) == 2


def _profiled(seconds: dict[str, float]) -> dict:
    """A record's attribution section with these seconds per category, every other category at 0."""
    categories = {c: {"seconds": seconds.get(c, 0.0), "share": 0.0} for c in ATTRIBUTION_CATEGORIES}
    return {"step_s": 3.0, "wall_step_s": 3.0, "measured_step_s": 2.9, "steps": 2, "categories": categories,
            "profiler": "test", "trace_dir": ""}


def test_tensor_parallel_s_shares_come_from_the_1_device_run_s_profile():
    """Of 2.0 s of compute (the optimizer's 0.5 s and the all-reduce's 0.4 s are not): matmuls 1.0 s (50%), the
    attention core and the activation 0.4 s (20%, split), the loss's softmax 0.2 s (10%, split with the
    vocabulary), norms, elementwise ops and the host's gaps 0.4 s (20%, whole)."""
    seconds = {"matmul": 1.0, "attention": 0.3, "activation": 0.1, "softmax": 0.2, "elementwise": 0.2,
               "normalization": 0.1, "host_idle": 0.1, "optimizer": 0.5, "all_reduce": 0.4}
    record = _one("prof", step=2.0, backend_metrics={"attribution": _profiled(seconds)})
    shares = ComputeShares.from_record(record)
    assert (shares.matmul, shares.split, shares.vocab, shares.whole) == pytest.approx((0.5, 0.2, 0.1, 0.2))
    assert shares.run_id == "prof"
    basis = from_records(TINY, [record])
    assert basis.compute_shares == shares and ", matmuls 50% of its compute (profile)" in basis.label
    assert basis.label.startswith("compute measured: torch_3d 1-device run prof (cpu), matmuls 50%")
    assert ComputeShares.from_record(_one()) is None and from_records(TINY, [_one()]).compute_shares is None
    assert ComputeShares.from_record(_one(backend_metrics={"attribution": _profiled({"optimizer": 1.0})})) is None
    # a step of less than a second's compute has its shares too (0.4 s of matmul in 0.8 s)
    short = ComputeShares.from_record(_one(backend_metrics={"attribution": _profiled({"matmul": 0.4,
                                                                                     "elementwise": 0.4})}))
    assert (short.matmul, short.whole) == pytest.approx((0.5, 0.5))


def test_what_a_record_says_of_its_run():
    assert accumulation(_one(accumulation_=3)) == 3
    assert accumulation({**_one(accumulation_=2), "layout": {"dp": 1, "pp": 2, "micro_batches": 4}}) == \
        Layout(pp=2, micro_batches=4).accumulation(2)
    assert stage_split({"layout": {"layers_per_stage": [3, 1], "stage_split": "2,2"}}) == [3, 1]
    assert stage_split({"layout": {"stage_split": [2, "2"]}}) == [2, 2]
    assert stage_split({"layout": {"stage_split": "3,1"}}) == [3, 1]
    assert stage_split({"layout": {"stage_split": "auto"}}) is None and stage_split({}) is None
    # the evaluation batch a rank took: common.loop's, or fewer where --eval-samples left its shard fewer
    batch = DEFAULTS["mlm"].eval_batch
    assert eval_batch(_one()) == batch and eval_batch({"config": {"skip_eval": True}}) is None
    assert eval_batch(_one(eval={"samples_evaluated": 10 * batch})) == batch
    assert eval_batch(_one(eval={"samples_evaluated": 8})) == 8
    assert eval_batch(_one(eval={"samples_evaluated": 40}, layout={"dp": 2})) == 20
    # a shard rounds up (41 over 2: 21), and a record without a layout is one data rank's
    assert eval_batch(_one(eval={"samples_evaluated": 41}, layout={"dp": 2})) == 21
    assert eval_batch({"workload": "mlm", "eval": {"samples_evaluated": 9}}) == 9
    assert background_load({"device_kind": "cuda", "load": {"other_busy_cores": 3.0}}) == 0.0
    assert background_load({"device_kind": "cpu", "devices": 2, "threads_per_device": 2,
                            "load": {"loadavg_1m_after": 3.0}}) == 0.0  # below the run's own 4 threads
    assert background_load({"device_kind": "cpu", "load": {"loadavg_1m_after": 3.0}}) == 2.0  # 1 x 1 own
    assert background_load({"device_kind": "cpu"}) == 0.0
    # mean 1.4 of the five timed steps over the fastest 1: 0.4 of 1.4 lost; fewer than five steps say nothing
    assert interruption_share({"step_times_s": [1, 1, None, 1, 1, 3]}) == pytest.approx(2 / 7)
    assert interruption_share({"step_times_s": [1, 1, 1, 3]}) == 0.0


def test_an_assumed_mfu_on_each_peak_it_can_rest_on(tmp_path):
    h100 = hardware_files.load("h100-sxm-8")
    datasheet = from_mfu(0.5, h100, "fp32")
    assert datasheet.s_per_mac_sample == pytest.approx(6 / (0.5 * 66.9e12)) and "fp32 datasheet peak" in \
        datasheet.label
    assert datasheet.s_per_param == pytest.approx(28 / (h100.memory_GBps * 1e9))
    assert (datasheet.s_per_micro_batch, datasheet.s_per_step, datasheet.memory_overhead) == (0.0, 0.0, 0.0)
    assert datasheet.precision == "fp32" and datasheet.assumed and datasheet.training_overhead is None
    path = tmp_path / "mine.toml"
    path.write_text(MINE)
    mine = hardware_files.load(str(path))
    filed = from_mfu(0.5, mine, "amp")
    assert filed.s_per_mac_sample == pytest.approx(6 / (0.5 * 600e12)) and "achievable peak (hardware file)" in \
        filed.label and "600 TFLOP/s" in filed.label
    assert from_mfu(0.5, mine, "fp32").s_per_param == pytest.approx(28 / 2000e9)
    # the rate it assumes (a decoder is then timed by the compute table's path, not as a measured run) and the
    # precision asked, kept for the activations' bytes
    assert (filed.flops_per_s, filed.precision) == (0.5 * 6e14, "amp")
    cpu = hardware_files.load("cpu-loopback-2core")
    with pytest.raises(ValueError, match="--assume-mfu: no fp32 peak is known for"):
        from_mfu(0.5, cpu, "fp32")
    assert from_mfu(0.5, cpu, "fp32", achievable=1e11).s_per_mac_sample == pytest.approx(6 / 0.5e11)
    # TFLOP/s are 1e12 FLOP/s exactly, both ways: 600 filed is 6e14 to the last bit, and a measured 999.9995e12
    # prints to 6 significant digits as 1000 (a factor off by one part in 1e12 would print 999.999)
    assert filed.s_per_mac_sample == 6 / (0.5 * 6e14)
    assert "fp32 measured achievable peak 1000 TFLOP/s" in from_mfu(0.5, cpu, "fp32", achievable=999.9995e12).label
    # the precision asked by default is fp32's
    assert from_mfu(0.5, h100) == datasheet and from_mfu(0.5, mine) == from_mfu(0.5, mine, "fp32")


def test_a_basis_under_autocast_and_what_a_record_leaves_out():
    """--precision amp: activations of 2 bytes in the memory the model counts, and the basis says amp; a record
    without grad_accum accumulates once; a label names the device description and every per-micro-batch run."""
    from common.predict.memory import activation_bytes, evaluation_bytes, state_bytes
    amp = _one(batch=32, accumulation_=3, devices_description="2 virtual CPU devices",
               memory={"process_peak_per_rank": [5e9], "training_per_rank": [2e9]})
    amp["config"]["precision"] = "amp"
    basis = from_records(TINY, [amp])
    state = state_bytes(TINY, Layout(), 0)
    training = activation_bytes(TINY, Layout(), 0, 32 // 3, value_bytes=2)
    assert basis.memory_overhead == pytest.approx(5e9 - state.total - max(training, evaluation_bytes(
        TINY, Layout(), 0, DEFAULTS["mlm"].eval_batch)))
    assert basis.training_overhead == pytest.approx(2e9 - state.grads - state.optimizer - training)
    assert basis.precision == "amp" and "(2 virtual CPU devices); GUESSED" in basis.label
    keras = {**amp, "backend": "keras_jax", "config": {**amp["config"], "skip_eval": True}}
    keras_state = state_bytes(TINY, Layout(), 0, backend="keras_jax")
    assert from_records(TINY, [keras]).memory_overhead == pytest.approx(5e9 - keras_state.total - training)
    assert from_records(TINY, [{**_one(), "config": {"model_size": "tiny"}}]).precision == "fp32"
    assert accumulation({"config": {}}) == accumulation({}) == 1
    three = from_records(TINY, [_one("k1", step=1.0), _one("k2", accumulation_=2, step=1.2),
                                _one("k4", accumulation_=4, step=1.6)])
    assert three.label == ("compute measured: torch_3d 1-device run k1 (cpu), per-micro-batch cost from k2, k4; "
                           "GUESSED: no --breakdown-steps probe, the whole step taken as forward+backward")
    from common.predict.basis import measured_memory
    assert measured_memory({"peak_memory_bytes": 7}, "process_peak_per_rank") == [7]


def test_an_assumed_mfu_says_which_peak_and_why_none(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(MINE)
    mine = hardware_files.load(str(path))
    assert from_mfu(0.5, mine, "amp").label == ("compute ASSUMED: MFU 0.5 of mine's bf16 achievable peak (hardware "
                                                "file) 600 TFLOP/s (no measured record)")
    assert from_mfu(0.5, mine, "bf16").s_per_mac_sample == pytest.approx(6 / 300e12)  # a math mode asked by name
    assert "measured achievable peak 100 TFLOP/s" in from_mfu(0.5, mine, "fp32", achievable=1e14).label
    nameless = hardware_files.load("cpu-loopback-2core")
    with pytest.raises(ValueError) as err:
        from_mfu(0.5, nameless, "fp32")
    assert str(err.value) == (f"--assume-mfu: no fp32 peak is known for {nameless.device_name or nameless.name!r} "
                              "(common.peak_flops, or achievable_TFLOPS in the hardware file)")
    no_bandwidth = path.with_name("slow.toml")
    no_bandwidth.write_text(MINE.replace("memory_GBps = 2000\n", ""))
    assert from_mfu(0.5, hardware_files.load(str(no_bandwidth)), "amp").s_per_param == 0.0


def test_a_basis_counts_the_state_of_its_own_backend_and_says_whether_it_recomputed():
    # The framework's overhead is the peak less the model's count: a Keras run counts Keras's step counter (one
    # int64 a device), not torch's (one float32 a tensor), so the same peak leaves a different overhead.
    memory = {"process_peak_per_rank": [3e9], "training_per_rank": [1e9]}
    torch_basis = from_records(TINY, [_one(memory=memory)])
    keras_basis = from_records(TINY, [_one(memory=memory, backend="keras_jax")])
    torch_state, keras_state = (state_bytes(TINY, Layout(), 0, backend=b) for b in ("torch_3d", "keras_jax"))
    assert torch_state.optimizer - keras_state.optimizer == 4 * len(stage_tensors(TINY, Layout(), 0)) - 8
    assert keras_basis.memory_overhead - torch_basis.memory_overhead == \
        pytest.approx(torch_state.total - keras_state.total, abs=1e-3)
    assert keras_basis.training_overhead - torch_basis.training_overhead == \
        pytest.approx(torch_state.optimizer - keras_state.optimizer, abs=1e-3)
    assert not torch_basis.recompute
    assert from_records(TINY, [_one(layout={"dp": 1, "recompute": True})]).recompute is True


def test_two_repeats_pool_the_probes_copies_over_the_repeats_median():
    """Two repeats of the main reference, one probed (copies at 2.0 and 2.2 s): its copies' median 2.1 over the
    two repeats' median step, (1.0 + 1.2) / 2 = 1.1; the one run alone: the probe's own slowdown."""
    probe = {"processes": 2, "step_s_p50": [2.0, 2.2], "slowdown": 1.5, "run_ids": ["c0", "c1"]}
    probed, other = _one("a", step=1.0, co_run=probe), _one("b", step=1.2)
    assert co_run_slowdown([probed], [probed, other]) == (pytest.approx(2.1 / 1.1), "a")
    assert co_run_slowdown([probed], [probed]) == (1.5, "a")
