"""keras_jax: its LayoutMap plan, the HLO reading of its collectives, every layout against one device, one
process per device through jax.distributed, and failures (a dead process, a pipeline it cannot run, bad input).

The plan and the HLO reader are pure Python; everything that trains runs in bench.run processes, where Keras
is imported with the JAX backend (this test process may have Keras on TensorFlow already)."""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from backends.keras_jax.hlo import collectives
from backends.keras_jax.layout_map import LAYER_SPLITS, layout_map_keys, unsplit, weight_plan
from common.final_params import FIELD as FINAL_PARAMS
from common.final_params import compared, deviation
from common.layout import Layout
from common.loop import FAULT_AFTER_STEP_ENV, FAULT_RANK_ENV
from common.results import validate_record
from common.spec import BERT_SIZES, model_spec
from tests import faults
from tests.conftest import assert_profiled, json_on_jax, run_cli, run_recorded

TINY = BERT_SIZES["tiny"]
RUN = ["--backend", "keras_jax", "--workload", "mlm", "--model-size", "tiny", "--data", "synthetic", "--steps", "3",
       "--warmup-steps", "1", "--skip-eval", "--threads-per-device", "1"]
# Measured (jax 0.10.2 on CPU): every layout's three losses within 1.2e-7 of one device's (GSPMD sums the
# replicas' gradients in another order); 1e-6 is eight times that and far below a lost all-reduce (>1e-3).
RTOL = 1e-6
FINAL_RTOL = 1e-4  # as torch_3d's: the final weights' norms and sums


def _shapes() -> dict[str, tuple[int, ...]]:
    shapes = {"token_embedding/embeddings": (TINY.vocab_size, TINY.hidden),
              "embeddings_layer_norm/gamma": (TINY.hidden,)}
    for i in range(TINY.layers):
        for proj in ("query", "key", "value"):
            shapes[f"transformer_layer_{i}/self_attention_layer/{proj}/kernel"] = (TINY.hidden, TINY.heads,
                                                                                   TINY.head_dim)
            shapes[f"transformer_layer_{i}/self_attention_layer/{proj}/bias"] = (TINY.heads, TINY.head_dim)
        shapes[f"transformer_layer_{i}/self_attention_layer/attention_output/kernel"] = (TINY.heads, TINY.head_dim,
                                                                                         TINY.hidden)
        shapes[f"transformer_layer_{i}/feedforward_intermediate_dense/kernel"] = (TINY.hidden, TINY.intermediate)
        shapes[f"transformer_layer_{i}/feedforward_intermediate_dense/bias"] = (TINY.intermediate,)
        shapes[f"transformer_layer_{i}/feedforward_output_dense/kernel"] = (TINY.intermediate, TINY.hidden)
    return shapes


def test_tensor_parallel_plan_splits_every_block_weight_over_model_and_nothing_else():
    plan = weight_plan(_shapes(), Layout(dp=2, tp=2))
    split = {p for p, axes in plan.items() if "model" in axes}
    assert len(split) == len(LAYER_SPLITS) * TINY.layers
    assert plan["transformer_layer_0/self_attention_layer/query/kernel"] == (None, "model", None)  # by heads
    assert plan["transformer_layer_1/feedforward_output_dense/kernel"] == ("model", None)  # by input rows
    assert plan["token_embedding/embeddings"] == (None, None)  # replicated (vocab_emb_dp)
    assert all("batch" not in axes for axes in plan.values())  # dp alone shards no weight


def test_sharded_state_puts_the_data_axis_on_a_dimension_that_divides():
    plan = weight_plan({"token_embedding/embeddings": (33283, 128), "bias": (7,), "k": (4, 6)},
                       Layout(fsdp=2))
    # the largest dimension that divides (the odd vocabulary does not), none where nothing does
    assert plan == {"token_embedding/embeddings": (None, "batch"), "bias": (None,), "k": (None, "batch")}
    both = weight_plan({"transformer_layer_0/feedforward_intermediate_dense/kernel": (128, 512)},
                       Layout(fsdp=2, tp=2))
    assert both == {"transformer_layer_0/feedforward_intermediate_dense/kernel": ("batch", "model")}


def test_layout_map_keys_match_their_weight_only_and_a_missed_split_is_named():
    plan = weight_plan(_shapes(), Layout(tp=2))
    keys = layout_map_keys(plan)
    for key, axes in keys.items():  # Keras matches with re.fullmatch: each key its own path, and only it
        matched = [p for p in plan if re.fullmatch(key, p)]
        assert len(matched) == 1 and plan[matched[0]] == axes
    placed = {p: axes for p, axes in plan.items()}
    assert unsplit(plan, placed) == []
    placed["transformer_layer_0/self_attention_layer/query/kernel"] = (None, None, None)
    assert unsplit(plan, placed) == ["transformer_layer_0/self_attention_layer/query/kernel: planned "
                                     "(None, 'model', None), placed (None, None, None)"]


HLO = """
ENTRY %main {
  %all-reduce.1 = f32[128,512]{1,0} all-reduce(f32[128,512]{1,0} %dot.3), channel_id=1, replica_groups={{0,1}}
  %all-reduce.2 = (f32[10]{0}, bf16[4,4]{1,0}) all-reduce(f32[10]{0} %a, bf16[4,4]{1,0} %b), channel_id=2
  %all-gather.3 = f32[64,8]{1,0} all-gather(f32[32,8]{1,0} %p), channel_id=3, dimensions={0}
  %reduce-scatter.4 = f32[32,8]{1,0} reduce-scatter(f32[64,8]{1,0} %g), channel_id=4, dimensions={0}
  %cp-start = (f32[16]{0}, f32[16]{0}) collective-permute-start(f32[16]{0} %x), source_target_pairs={{0,1}}
  %cp-done = f32[16]{0} collective-permute-done((f32[16]{0}, f32[16]{0}) %cp-start)
  %add = f32[16]{0} add(f32[16]{0} %x, f32[16]{0} %x)
}
"""


def test_collectives_are_read_from_hlo_with_torch_comm_conventions():
    assert collectives(HLO) == {
        "all_reduce": {"bytes": 128 * 512 * 4 + 10 * 4 + 16 * 2, "calls": 2},
        "all_gather": {"bytes": 64 * 8 * 4, "calls": 1},       # the gathered output
        "reduce_scatter": {"bytes": 64 * 8 * 4, "calls": 1},   # the whole input
        "send_recv": {"bytes": 16 * 4, "calls": 1},            # an async start counted once, its done not
    }


def _run(out: Path, *args: str, env: dict | None = None):
    return run_recorded(out, *RUN, *args, env=env)


@pytest.fixture(scope="module")
def one_device(tmp_path_factory, data_dir):
    proc, record = _run(tmp_path_factory.mktemp("one"), "--devices", "1", "--batch-size", "8", "--profile", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return record


# Plain data parallel (dp2) is bench.parity's "keras_jax: 2 devices = 1 device x 2 micro-batches" for both workloads
# (tests/test_parity.py) and test_multihost's keras_jax run across two hosts. tp2 in one process is not here
# apart: dp2xtp2-rc splits the same weights over its model axis in one process, tp2-multi_process the same tp2.
LAYOUTS = {
    # One process per device: jax.distributed over loopback, the same GSPMD program in both.
    "tp2-multi_process": ["--devices", "2", "--model-parallel", "2", "--batch-size", "8",
                          "--jax-mode", "multi_process"],
    # One process over its devices: its memory figures hold them all (processes_share).
    "fsdp2": ["--devices", "2", "--fsdp", "2", "--batch-size", "4"],
    # Recompute changes what is kept for the backward, never the result.
    "dp2xtp2-rc": ["--devices", "4", "--model-parallel", "2", "--batch-size", "4", "--recompute"],
}


@pytest.mark.e2e
@pytest.mark.timeout(600)
@pytest.mark.parametrize("args", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_a_layout_trains_what_one_device_trains(tmp_path, one_device, args):
    proc, record = _run(tmp_path / "out", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = one_device
    assert record["status"] == "ok" and validate_record(record) == []
    assert record["global_batch"] == ref["global_batch"] == 8
    got, want = [c[1] for c in record["loss"]["curve"]], [c[1] for c in ref["loss"]["curve"]]
    assert got == pytest.approx(want, rel=RTOL)
    metrics, lay, devices = record["backend_metrics"], record["layout"], record["devices"]
    final, final_ref = metrics[FINAL_PARAMS], ref["backend_metrics"][FINAL_PARAMS]
    assert set(final) == set(final_ref)
    for name, want in final_ref.items():
        assert not compared(want) or deviation(want, final[name]) <= FINAL_RTOL, name
    assert metrics["trainable_params"] == record["params"] == TINY.param_count()
    states, comm = metrics["state_bytes_per_rank"], metrics["comm_per_step"]
    assert len(states) == len(comm) == devices
    whole = ref["backend_metrics"]["state_bytes_per_rank"][0]
    assert whole["params"] == whole["grads"] == 4 * TINY.param_count()
    if lay["fsdp"] > 1:  # every weight split over the data axis: half of everything
        assert all(s["params"] <= 0.5 * whole["params"] + 4 * TINY.hidden for s in states)
        # The shards gathered for the compute, and the gradients reduced shard by shard, never all-reduced whole
        # (as plain data parallel does, below). XLA picks how: jax 0.10.2 on CPU lowers the gradients'
        # reduce-scatter to all-to-alls and small all-reduces (measured: 2.3 MB all-reduced of 18.9 MB).
        assert all("all_gather" in c for c in comm), comm
        assert all(c.get("all_reduce", {"bytes": 0})["bytes"] < 0.5 * whole["grads"] for c in comm), comm
    elif lay["tp"] == 1:  # plain data parallel: the gradients all-reduced
        assert all(c["all_reduce"]["bytes"] >= s["params"] for c, s in zip(comm, states))
    if lay["tp"] > 1:  # the block weights split: less than the whole on every device, and the compiler all-reduces
        assert all(s["params"] < whole["params"] for s in states)
        assert all(c["all_reduce"]["calls"] >= 2 for c in comm)
        assert len(metrics["sharded_weights"]) == len(LAYER_SPLITS) * TINY.layers
    assert metrics["compile_s"] > 0 and metrics["recompiled_in_measured_window"] == []
    one_process = "multi_process" not in args
    assert record["memory"]["processes_share"] is one_process


@pytest.mark.e2e
def test_the_profile_of_one_device_opens_with_jax_and_attributes_the_step(one_device):
    """--profile 2 on the reference run: the XSpace read back by JAX's own reader, the HLO its events name beside."""
    assert_profiled(one_device, profile_steps)
    fast = one_device["backend_metrics"]["fast_path"]["options"]
    assert fast["flash_attention"] is False and fast["prng_impl"] == "threefry2x32"  # a CPU offers no flash kernel


def profile_steps(folder: Path) -> int:
    import jax

    from backends.keras_jax.profile import HLO_FILE
    from common.attribution import STEP_MARKER

    [path] = folder.glob("plugins/profile/*/*.xplane.pb")
    assert "HloModule" in (path.parent / HLO_FILE).read_text() and list(path.parent.glob("*perfetto_trace.json.gz"))
    return sum(e.name == STEP_MARKER for plane in jax.profiler.ProfileData.from_file(str(path)).planes
               for line in plane.lines for e in line.events)


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_dead_process_fails_the_run_within_seconds_naming_it(tmp_path, data_dir):
    """Process 1 of a multi-process tp2 run exits hard after step 2: process 0 waits inside the next step's
    collectives; the run ends `failed` naming rank 1, long before --collective-timeout, and leaves nothing."""
    out, timeout = tmp_path / "out", 120
    began = time.monotonic()
    proc, record = _run(out, "--devices", "2", "--model-parallel", "2", "--batch-size", "8", "--jax-mode",
                        "multi_process", "--steps", "50", "--collective-timeout", str(timeout),
                        env={FAULT_AFTER_STEP_ENV: "2", FAULT_RANK_ENV: "1"})
    elapsed = time.monotonic() - began
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert record["status"] == "failed" and validate_record(record) == []
    assert "rank 1" in record["error"] and "code 17" in record["error"], record["error"]
    assert elapsed < timeout
    time.sleep(1)
    assert faults.run_processes(out) == [], "processes of the run left behind"


@pytest.mark.e2e
def test_a_pipeline_is_unsupported_with_the_reason_and_bad_layout_input_is_one_line(tmp_path, data_dir):
    proc, record = _run(tmp_path / "out", "--devices", "2", "--pipeline-stages", "2", "--micro-batches", "2")
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert record["status"] == "unsupported" and "no pipeline parallelism" in record["error"]
    bad = run_cli("bench.run", *RUN, "--out", str(tmp_path / "bad"), "--devices", "4", "--model-parallel", "3")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0, bad.stderr
    assert "not divisible by model parallel 3" in bad.stderr
    assert not (tmp_path / "bad" / "runs").exists()



@pytest.mark.e2e
def test_the_bare_loop_s_clock_adds_no_work_to_fit():
    """The bare loop times Keras' model.fit through a callback: fit with it syncs the training state into the
    model's variables as often as fit without it (once, at the epoch's end), and its clock ticks every step. Its
    window opens after fit's second compile (the second step) while a step is left to time."""
    script = ("import json, keras, numpy as np\n"
              "from backends.keras_jax.bare import StepClock, clock_warmup\n"
              "from common.calibration import BareClock\n"
              "def fit(callbacks):\n"
              "    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])\n"
              "    model.compile(optimizer='adam', loss='mse', jit_compile=True)\n"
              "    syncs, sync = [], model.jax_state_sync\n"
              "    model.jax_state_sync = lambda: syncs.append(1) or sync()\n"
              "    model.fit(np.ones((8, 4)), np.ones((8, 3)), batch_size=2, epochs=1, verbose=0,\n"
              "              callbacks=callbacks)\n"
              "    return len(syncs)\n"
              "clock = BareClock(1)\n"
              "warmups = [clock_warmup(w, n) for w, n in ((1, 3), (1, 2), (5, 30), (0, 1))]\n"
              "print(json.dumps({'plain': fit([]), 'timed': fit([StepClock(clock)]),\n"
              "                  'steps': clock.result()['measured_steps'], 'warmups': warmups}))\n")
    counts = json_on_jax(script)
    assert counts["timed"] == counts["plain"] and counts["steps"] == 3, counts
    assert counts["warmups"] == [2, 1, 5, 0], counts


@pytest.mark.e2e
def test_a_keras_jax_process_builds_both_models_without_tensorflow():
    """keras-hub imports TensorFlow wherever it is installed (4.4 s and TensorFlow's memory in every keras_jax
    process, measured); the worker keeps it out, and both models still build on JAX."""
    script = ("import json, sys\n"
              "import backends.keras_jax.worker\n"
              "from backends.keras_common.models import build_model, trainable_param_count\n"
              "from common.spec import model_spec\n"
              "params = {w: trainable_param_count(build_model(w, model_spec(w))) for w in ('cnn', 'mlm')}\n"
              "print(json.dumps({'params': params, 'tensorflow': sys.modules.get('tensorflow') is not None}))\n")
    built = json_on_jax(script)
    assert built == {"params": {w: model_spec(w).param_count() for w in ("cnn", "mlm")}, "tensorflow": False}
