"""torch_3d: every layout trains what one device trains, measures what it holds and sends, and fails
cleanly; its tensor-parallel plan splits the weights mindspore_auto's strategy table splits."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from backends.keras_common.weights import weight_map
from backends.keras_jax.layout_map import model_axis
from backends.mindspore_auto.parallel_config import ParallelConfig
from backends.mindspore_auto.strategies import bert_strategies
from backends.torch_3d.parallelize import tensor_parallel_splits
from backends.torch_common.models import build_model
from backends.torch_common.weights import final_params
from bench.reporting.layouts import layout_frame
from common.final_params import FIELD as FINAL_PARAMS
from common.final_params import compared, deviation
from common.initial_weights import layout as weight_layout
from common.layout import Layout
from common.loop import FAULT_AFTER_STEP_ENV, FAULT_RANK_ENV
from common.predict.collectives import per_kind
from common.predict.executed import collectives
from common.predict.memory import value_bytes
from common.predict.validation import run_layout
from common.results import load_records, validate_record
from common.spec import BERT_SIZES, CNN
from tests import faults
from tests.conftest import assert_profiled, chrome_trace_steps, run_recorded

TINY = BERT_SIZES["tiny"]
# Three steps of the tiny BERT, so the curve covers two updates after the first loss.
RUN = ["--backend", "torch_3d", "--workload", "mlm", "--model-size", "tiny", "--data", "real", "--steps", "3",
       "--warmup-steps", "1", "--skip-eval", "--threads-per-device", "1"]
# Measured on CPU (torch 2.13, gloo): tensor parallel and the pipelines give the 1-device losses bit for
# bit; dp2, fsdp2 and dp2 x tp2 differ by at most 1.3e-7 relative over the three steps (the all-reduce
# sums two halves, one device sums once: float32 rounding of the gradient). 1e-6 is eight times that,
# and still ten times below what one bad micro-batch or a lost tensor-parallel all-reduce moves (>1e-3).
RTOL = 1e-6


def _run(out: Path, *args: str, env: dict | None = None):
    return run_recorded(out, *RUN, *args, env=env)


def _swept(layout_sweep) -> dict[str, dict]:
    """The records of the layout sweep test_layouts checks (conftest.LAYOUT_SWEEP: these runs, through
    bench.compare --layouts dp2,tp2) by layout name: "1 device", "dp2", "tp2"."""
    proc, out = layout_sweep
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = {r["run_id"]: r for r in load_records(out)}
    return {row.layout: records[row.run_id] for row in layout_frame(list(records.values())).itertuples()}


@pytest.fixture(scope="module")
def one_device(tmp_path_factory, layout_sweep):
    """The references: one device, global batch 8, in one step (for data and tensor parallel: the layout
    sweep's) and in two accumulated micro-batches of 4 (for the pipelines)."""
    proc, accumulated = _run(tmp_path_factory.mktemp("one"), "--devices", "1", "--batch-size", "4", "--grad-accum", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"whole": _swept(layout_sweep)["1 device"], "accumulated": accumulated}


# bench.run's arguments, or None for a layout the layout sweep ran (as --devices 2 --batch-size 4, and
# --devices 2 --model-parallel 2 --batch-size 8); and the reference it is held to.
LAYOUTS = {
    "dp2": (None, "whole"),
    "tp2": (None, "whole"),
    # auto: the tiny BERT's two layers leave one split, which the layout must still resolve and say
    "pp2-gpipe": (["--devices", "2", "--pipeline-stages", "2", "--micro-batches", "2", "--batch-size", "4",
                   "--stage-split", "auto"], "accumulated"),
    "pp2-1f1b": (["--devices", "2", "--pipeline-stages", "2", "--micro-batches", "2", "--batch-size", "4",
                  "--pipeline-schedule", "1f1b", "--recompute"], "accumulated"),
    "fsdp2": (["--devices", "2", "--fsdp", "2", "--batch-size", "4"], "whole"),
    # ZeRO-2: each layer gathered once a step, not again for its backward (the counted collectives say so)
    "fsdp2-zero2": (["--devices", "2", "--fsdp", "2", "--zero2", "--batch-size", "4"], "whole"),
    # --recompute: the recomputed forward's tensor-parallel all-reduces, for the predicted collectives
    "dp2xtp2-rc": (["--devices", "4", "--model-parallel", "2", "--batch-size", "4", "--recompute"], "whole"),
    "tp2-vocab": (["--devices", "2", "--model-parallel", "2", "--vocab-split", "--batch-size", "8"], "whole"),
}
# The final weights, per canonical weight, within FINAL_RTOL by bench.parity's measure (common.final_params:
# norm and sum against the weight's norm; the key biases, which only rounding moves, left out).
# Measured on the norms: at most 5.7e-6 (dp2 x tp2 FSDP, pp2 x tp2 split vocabulary); AdamW divides each
# update by the gradient's own size, so the small biases' rounding shows through more than in the loss.
FINAL_RTOL = 1e-4


@pytest.mark.e2e
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", LAYOUTS)
def test_a_layout_trains_what_one_device_trains(tmp_path, one_device, layout_sweep, name):
    args, reference = LAYOUTS[name]
    if args is None:
        record = _swept(layout_sweep)[name]
        assert_profiled(record, chrome_trace_steps)  # --profile 2 (conftest.LAYOUT_SWEEP)
    else:
        proc, record = _run(tmp_path / "out", *args)
        assert proc.returncode == 0, proc.stderr[-3000:]
    ref = one_device[reference]
    assert record["status"] == "ok" and validate_record(record) == []
    assert record["global_batch"] == ref["global_batch"] == 8
    got, want = [c[1] for c in record["loss"]["curve"]], [c[1] for c in ref["loss"]["curve"]]
    assert got == pytest.approx(want, rel=RTOL)

    lay, metrics = record["layout"], record["backend_metrics"]
    final, final_ref = metrics[FINAL_PARAMS], ref["backend_metrics"][FINAL_PARAMS]
    assert set(final) == set(final_ref) == {t.name for t in weight_layout(TINY)}
    for name, want in final_ref.items():
        assert not compared(want) or deviation(want, final[name]) <= FINAL_RTOL, name
    devices = record["devices"]
    assert lay["dp"] * lay["fsdp"] * lay["tp"] * lay["pp"] * lay["cp"] == devices and len(lay["per_rank"]) == devices
    assert len(record["peak_memory_per_rank"]) == devices
    memory = record["memory"]
    assert memory["process_peak_per_rank"] == record["peak_memory_per_rank"] and not memory["processes_share"]
    # the training's own memory: at least the gradients and optimizer state each rank counted, below its process
    for training, peak, state in zip(memory["training_per_rank"], memory["process_peak_per_rank"],
                                     metrics["state_bytes_per_rank"]):
        assert state["grads"] + state["optimizer"] <= training < peak
    assert "VmHWM" in memory["method"]
    peak = record["achievable_peak"]
    assert len(peak["per_rank"]) == devices and all(f > 0 for f in peak["per_rank"]) and peak["precision"] == "fp32"
    assert record["mfu_achievable"] == pytest.approx(record["achieved_flops"] / (devices * peak["flops_per_s"]))
    states, comm = metrics["state_bytes_per_rank"], metrics["comm_per_step"]
    assert len(states) == len(comm) == devices
    # the predictor's collectives (common/predict/executed.py) are what each rank counted: calls and bytes per kind;
    # a pipeline's sends but for the probed step's (--warmup-steps 1: the first) one-off exchange of shapes
    skipped = {"send_recv"} if lay["pp"] > 1 else set()
    assert [{kind: (c["calls"], c["bytes"]) for kind, c in rank.items() if kind not in skipped} for rank in comm] \
        == [{kind: c for kind, c in rank.items() if kind not in skipped} for rank in predicted_comm(record)]
    whole = ref["backend_metrics"]["state_bytes_per_rank"][0]
    if lay["fsdp"] > 1:  # FSDP: every rank holds half of everything, and says so in its traffic
        assert all(s["params"] < 0.51 * whole["params"] for s in states)
        assert all({"all_gather", "reduce_scatter"} <= set(c) for c in comm)
    elif lay["tp"] == 1 and lay["pp"] == 1:  # plain data parallel: one all-reduce of every gradient
        assert all(c["all_reduce"]["bytes"] == s["params"] for c, s in zip(comm, states))
    if lay["tp"] > 1:
        assert all(s["params"] < whole["params"] for s in states)
    if lay["vocab_split"]:  # each rank holds half of the token table (most of the tiny model)
        table = TINY.vocab_size * TINY.hidden * 4
        assert all(s["params"] < whole["params"] - table / 2 for s in states)
        assert all(c["all_reduce"]["calls"] >= 4 * TINY.layers for c in comm)  # 2 forward + 2 backward per layer
    if lay["pp"] > 1:
        assert all(c["send_recv"]["calls"] > 0 for c in comm)
        bubble = metrics["bubble"]
        assert bubble["analytic"] == pytest.approx(1 / 3)
        assert len(bubble["measured_per_stage"]) == 2 and all(0 <= b < 1 for b in bubble["measured_per_stage"])
        assert lay["layers_per_stage"] == [1, 1]
        assert lay["per_rank"][0]["holds"].startswith("embeddings + layers 0-0")
        assert lay["per_rank"][-1]["holds"].endswith("MLM head")


def predicted_comm(record: dict) -> list[dict[str, tuple[int, int]]]:
    """Per rank, the calls and bytes per kind the predictor's collectives (common/predict/executed.py, from the
    spec and the layout) give for its pipeline stage, as the record's comm_per_step counts them."""
    layout = run_layout(record)
    activation = value_bytes(record["config"]["precision"])
    stages = [per_kind(collectives(TINY, layout, record["global_batch"], s, "torch_3d", activation,
                                   record["device_kind"])) for s in range(layout.pp)]
    return [{kind: (c["calls"], c["bytes"]) for kind, c in stages[layout.coordinates(rank)["pp"]].items()}
            for rank in range(record["devices"])]


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_tp2_sends_megatron_s_all_reduces_and_no_more(layout_sweep):
    """Per layer and micro-batch, Megatron's four all-reduces of one micro-batch's activations: forward the
    attention output's and ffn_out's partial sums, backward the attention's and the FFN's input gradients, each
    once (query, key and value take one prepared input, so their three partial gradients are summed first)."""
    record = _swept(layout_sweep)["tp2"]
    lay = record["layout"]
    micro_batch = record["global_batch"] // (lay["dp"] * lay["fsdp"] * lay["micro_batches"])
    calls = (2 + 2) * TINY.layers * lay["micro_batches"]
    each = micro_batch * TINY.seq_len * TINY.hidden * 4
    sent = [{kind: (c["calls"], c["bytes"]) for kind, c in rank.items()}
            for rank in record["backend_metrics"]["comm_per_step"]]
    assert sent == [{"all_reduce": (calls, calls * each)}] * record["devices"]


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_rank_dead_inside_a_pipeline_fails_the_run_naming_it(tmp_path, data_dir):
    """The last stage exits hard after step 2; the first stage is then inside step 3's pipeline, waiting
    for it. The run ends `failed`, names the rank, well inside --collective-timeout, and leaves nothing."""
    out, timeout = tmp_path / "out", 60
    began = time.monotonic()
    proc, record = _run(out, "--devices", "2", "--pipeline-stages", "2", "--micro-batches", "2", "--batch-size", "4",
                        "--steps", "50", "--collective-timeout", str(timeout),
                        env={FAULT_AFTER_STEP_ENV: "2", FAULT_RANK_ENV: "1"})
    elapsed = time.monotonic() - began
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert record["status"] == "failed" and validate_record(record) == []
    assert "rank 1" in record["error"], record["error"]
    assert elapsed < timeout
    time.sleep(1)  # a process killed a moment ago may still be leaving /proc
    assert faults.run_processes(out) == [], "processes of the run left behind"


def keras_split(spec, canonical: str, layout: Layout) -> int | None:
    """The canonical dimension keras_jax's LayoutMap splits: its Keras-layout split, traced back through the
    conversion of the canonical weight (per-head Q/K/V, transposed kernels) by the canonical element indices
    each shard holds. None: not split; "other": split, but not into contiguous blocks of one canonical dim."""
    path, (_, convert) = next((p, m) for p, m in weight_map(spec).items() if m[0] == canonical)
    shape = next(t.shape for t in weight_layout(spec) if t.name == canonical)
    index = np.arange(int(np.prod(shape))).reshape(shape)
    axis = model_axis(path, layout)
    if axis is None:
        return None
    shards = np.split(convert(index), layout.tp, axis=axis)
    for dim in range(len(shape)):
        blocks = np.split(index, layout.tp, axis=dim)
        if all(np.array_equal(np.sort(s, axis=None), np.sort(b, axis=None)) for s, b in zip(shards, blocks)):
            return dim
    return "other"


@pytest.mark.parametrize("tp", [2, 4])
def test_torch_3d_mindspore_and_keras_jax_split_the_same_dimension_of_the_same_weight(tp):
    """All three in canonical weight names: for each weight of a BERT block, the dimension each framework
    splits over the model-parallel devices (a [out, in] weight: 0 column-wise, 1 row-wise); keras_jax's
    LayoutMap splits the Keras layouts (per head, transposed), traced back to canonical dims."""
    spec = BERT_SIZES["mini"]
    strategies = bert_strategies(ParallelConfig.from_layout(Layout(tp=tp), "semi_auto"))

    def mindspore_split(canonical: str) -> int | None:
        # The weight is the second input of its matmul; its strategy says how often each dim is cut.
        op = canonical.split(".", 2)[2].rsplit(".", 1)[0]  # layers.<i>.attention.query.weight -> attention.query
        cuts = strategies[f"{op}.matmul"][1]
        return next((d for d, n in enumerate(cuts) if n == tp), None)

    torch_splits = tensor_parallel_splits(spec.layers)
    block_weights = [t.name for t in weight_layout(spec) if t.name.startswith("layers.") and t.name.endswith(".weight")
                     and len(t.shape) == 2]
    assert set(torch_splits) == set(block_weights)
    assert {name: mindspore_split(name) for name in block_weights} == torch_splits
    assert {name: keras_split(spec, name, Layout(tp=tp)) for name in block_weights} == torch_splits


def test_torch_3d_and_mindspore_split_the_vocabulary_on_the_same_dimension(tmp_path):
    """--vocab-split: the token table (tied to the MLM decoder) and the decoder bias split over the
    vocabulary, dim 0, in both: torch_3d's DTensor placements as split_vocabulary leaves them (on a
    one-process mesh, where the placement is the plan's) and MindSpore's strategies for tp 2."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard

    from backends.torch_3d.parallelize import MESH_DIMS
    from backends.torch_3d.vocab import split_vocabulary

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = build_model("mlm", TINY)
        split_vocabulary(model, init_device_mesh("cpu", (1, 1, 1), mesh_dim_names=MESH_DIMS))
        torch_dims = {name: [p.dim for p in param.placements if isinstance(p, Shard)]
                      for name, param in (("table", model.token_embedding.weight), ("bias", model.head_bias))}
    finally:
        dist.destroy_process_group()
    strategies = bert_strategies(ParallelConfig.from_layout(Layout(tp=2, vocab_split=True), "semi_auto"))
    ms_dims = {"table": [d for d, n in enumerate(strategies["embedding.token"][0]) if n == 2],
               "decoder": [d for d, n in enumerate(strategies["head.decoder.matmul"][1]) if n == 2],
               "bias": [d for d, n in enumerate(strategies["head.decoder.bias"][1]) if n == 2]}
    assert torch_dims == {"table": [0], "bias": [0]}
    assert ms_dims == {"table": [0], "decoder": [0], "bias": [0]}  # the decoder is the table, tied
    split = Layout(tp=2, vocab_split=True)
    assert {"table": keras_split(TINY, "embeddings.token", split), "bias": keras_split(TINY, "head.bias", split)} \
        == {"table": 0, "bias": 0}


def test_layout_ranks_roles_and_bubble():
    lay = Layout(dp=2, tp=2, pp=2, micro_batches=4, schedule="1f1b")
    assert lay.devices == 8 and lay.bubble() == pytest.approx(1 / 5)
    # tensor parallel innermost, then data parallel, the stage outermost
    assert lay.coordinates(0) == {"pp": 0, "dp": 0, "fsdp": 0, "cp": 0, "tp": 0, "data": 0}
    assert lay.coordinates(3) == {"pp": 0, "dp": 1, "fsdp": 0, "cp": 0, "tp": 1, "data": 1}
    assert lay.coordinates(6) == {"pp": 1, "dp": 1, "fsdp": 0, "cp": 0, "tp": 0, "data": 1}
    roles = lay.as_record(TINY, 8)["per_rank"]
    assert roles[0]["holds"] == "embeddings + layers 0-0, heads, FFN shard 1/2"
    assert roles[7]["holds"] == "layers 1-1 + MLM head, heads, FFN shard 2/2"


def test_final_params_name_every_trainable_weight_and_summarise_it_whole():
    """What torch_ddp and torch_dp (TorchTrainer) write into backend_metrics.final_params for bench.parity."""
    model = build_model("cnn", CNN)
    summary = final_params(model)
    moving = ("moving_mean", "moving_var")
    assert set(summary) == {t.name for t in weight_layout(CNN) if not t.name.endswith(moving)}
    weight = model.classifier[0].weight.detach().double()
    assert summary["fc0.weight"] == {"norm": pytest.approx(float(weight.norm()), rel=1e-12),
                                     "sum": pytest.approx(float(weight.sum()), rel=1e-12), "size": weight.numel()}
