"""--profile's attribution on fixed events: time given out once (innermost event, threads split, idle only when
nothing works), each framework's pattern table on op names taken from real traces, the section and the report."""
from __future__ import annotations

import pytest

from bench.reporting.attribution import attribution_blocks, largest_difference, row_key
from bench.reporting.document import Image, Table, Text
from common.attribution import STEP_MARKER, Classifier, OpEvent, attribution, group_seconds, split_time
from common.sections import ATTRIBUTION_CATEGORIES, Attribution

# As the frameworks' tables: what encloses an op first (the optimizer), then the op's own name (anchored at the end).
RULES = (("optimizer", r"Optimizer"), ("matmul", r"mm$"), ("host_idle", r"(wrapper|wait)$"), ("elementwise", r"add$"))


def ev(name, start, end, thread="main"):
    return OpEvent(name, start, end, thread)


def test_the_innermost_event_owns_its_time_and_the_rest_of_the_window_is_host_idle():
    events = [ev("wrapper", 0.0, 8.0), ev("mm", 1.0, 4.0), ev("add", 2.0, 3.0), ev("Optimizer", 5.0, 7.0),
              ev("mm", 5.5, 6.0)]  # an mm inside the optimizer is the optimizer's
    seconds, unclassified, _, concurrency = split_time(events, [(0.0, 10.0)], Classifier(RULES))
    assert seconds == pytest.approx({"matmul": 2.0, "elementwise": 1.0, "optimizer": 2.0, "host_idle": 5.0})
    assert concurrency == pytest.approx(1.0)
    assert unclassified == {}


def test_threads_that_work_at_once_split_the_time_and_a_waiting_thread_takes_none():
    events = [ev("mm", 0.0, 4.0, "a"), ev("add", 2.0, 6.0, "b"), ev("wait", 0.0, 10.0, "main"),
              ev("unknown op", 8.0, 9.0, "b")]
    seconds, unclassified, _, concurrency = split_time(events, [(0.0, 10.0)], Classifier(RULES))
    assert seconds == pytest.approx({"matmul": 3.0, "elementwise": 3.0, "other": 1.0, "host_idle": 3.0})
    assert concurrency == pytest.approx(9.0 / 7.0)  # 2 threads for 2 s, 1 for 5 s
    assert unclassified == pytest.approx({"unknown op": 1.0})
    assert sum(seconds.values()) == pytest.approx(10.0)


def test_only_the_step_windows_count_and_the_step_marker_is_host_time():
    events = [ev("mm", 0.0, 3.0), ev(STEP_MARKER, 2.0, 4.0, "main2"), ev("mm", 5.0, 6.0)]
    section = attribution(events, [(2.0, 4.0), (5.0, 7.0)], Classifier(RULES), wall_step_s=2.0,
                          measured_step_s=1.5, profiler="test", trace_dir="/tmp", model_flops_per_step=4e9)
    assert section.steps == 2 and section.step_s == pytest.approx(2.0)
    assert section.categories["matmul"].seconds == pytest.approx(1.0)  # (1 + 1) s over 2 steps
    assert section.categories["host_idle"].share == pytest.approx(0.5)
    assert sum(c.share for c in section.categories.values()) == pytest.approx(1.0)
    assert section.model_flops_per_s_in_matmul == pytest.approx(4e9)
    assert set(section.categories) == set(ATTRIBUTION_CATEGORIES)
    assert Attribution.from_metrics(section.to_metrics()) == section


def test_counted_flops_go_to_the_events_category():
    events = [OpEvent("mm", 0.0, 1.0, "t", flops=3e9), OpEvent("Optimizer", 1.0, 3.0, "t"),
              OpEvent("mm", 1.5, 2.0, "t", flops=1e9)]
    section = attribution(events, [(0.0, 4.0)], Classifier(RULES), wall_step_s=4.0, measured_step_s=None,
                          profiler="test", trace_dir="/tmp")
    assert section.categories["matmul"].flops_per_s == pytest.approx(3e9)
    assert section.categories["optimizer"].flops_per_s == pytest.approx(1e9 / 2.0)


def test_a_pattern_table_naming_an_unknown_category_is_refused():
    with pytest.raises(ValueError, match="unknown attribution categories"):
        Classifier((("matmuls", "mm"),))


TORCH_NAMES = {
    "aten::mm": "matmul",
    "autograd::engine::evaluate_function: AddmmBackward0 > AddmmBackward0 > aten::mm": "matmul",
    "autograd::engine::evaluate_function: AddmmBackward0": "host_idle",
    "aten::scaled_dot_product_attention > aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
    "Optimizer.step#AdamW.step > aten::_fused_adamw_": "optimizer",
    "aten::cross_entropy_loss > aten::log_softmax > aten::_log_softmax": "softmax",
    "aten::layer_norm > aten::native_layer_norm": "normalization",
    "aten::gelu": "activation",
    "aten::embedding > aten::index_select": "data_movement",
    "c10d::allreduce_": "all_reduce",
    "aten::add": "elementwise",
    "aten::view": "host_idle",
}
TF_NAMES = {
    "bert_mlm_1/mlm_head_1/token_embedding_1/Tensordot/MatMul:MatMul": "matmul",
    "bert_mlm_1/transformer_layer_0_1/self_attention_layer_1/key_1/MatMul:BatchMatMulV2": "matmul",
    "bert_mlm_1/transformer_layer_0_1/self_attention_layer_1/einsum/Einsum:Einsum": "attention",
    "bert_mlm_1/transformer_layer_0_1/self_attention_layer_norm_1/moments/mean:Mean": "normalization",
    "SparseSoftmaxCrossEntropyWithLogits/SparseSoftmaxCrossEntropyWithLogits:SparseSoftmaxCrossEntropyWithLogits":
        "softmax",
    "torch_adam_w/update_0_42/truediv:RealDiv": "optimizer",
    "gradient_tape/bert_mlm_1/mlm_head_1/token_embedding_1/transpose/transpose:Transpose": "data_movement",
    "bert_mlm_1/transformer_layer_0_1/feedforward_intermediate_dense_1/Gelu/mul_3:Mul": "activation",
    "ExecutorState::Process": "host_idle",
    "AddN_19:AddN": "elementwise",
    # oneDNN's own op types, where TensorFlow's CPU build picks its kernels
    "gradient_tape/replica_1/simple_cnn_1/conv3_1/convolution/Conv2DBackpropFilter:"
    "_MklNativeConv2DBackpropFilterWithBias": "matmul",
    "replica_1/simple_cnn_1/conv3_1/BiasAdd:_MklNativeFusedConv2D": "matmul",
    "replica_1/simple_cnn_1/dense_1/MatMul:_MklMatMul": "matmul",
    # an op's work sharded over the intra-op thread pool, nested in it
    "gradient_tape/replica_1/simple_cnn_1/conv1_1/convolution/Conv2DBackpropInput:Conv2DBackpropInput > ParallelFor":
        "matmul",
    "AddN_19:AddN > ParallelFor": "elementwise",
    "ParallelFor": "other",
    # --compile: XLA's instructions, named after the TF op or the fusion
    "CpuExecutable::ExecuteAsyncOnStream > MatMul.82": "matmul",
    "subtract_exponential_fusion": "softmax",
    "add_bitcast_fusion": "elementwise",
    "CpuExecutable::ExecuteAsyncOnStream": "host_idle",
    "convert_to_tensor": "host_idle",
}
JAX_NAMES = {
    "ynn_fusion.68 [dot] @jit(_step)/jvp(mlm_head)/token_embedding/dot_general": "matmul",
    "ynn_fusion.3 [reduce] @jit(_step)/transpose(jvp(mlm_head))/reduce_sum": "elementwise",
    "ynn_fusion.96 [dot] @jit(_step)/jvp(transformer_layer_0)/self_attention_layer/vmap(BTNH,BSNH->BNTS)/dot_general":
        "attention",
    "wrapped_broadcast.10 [broadcast] @jit(_step)/jvp(transformer_layer_0)/self_attention_layer_norm/mul":
        "normalization",
    "copy_bitcast_fusion.31 [copy,transpose] @jit(_step)/transpose(jvp())/add_any": "data_movement",
    "subtract_exponential_fusion [exponential,subtract] @jit(_step)/jvp(loss)/exp": "softmax",
    "multiply_add_fusion.83 [add,multiply] @jit(_step)/torch_adam_w/add": "optimizer",
    "multiply_tanh_fusion [add,multiply,tanh] @jit(_step)/jvp(transformer_layer_1)/feedforward_intermediate_dense/tanh":
        "activation",
    "PjitFunction(_step)": "host_idle",
}
MINDSPORE_NAMES = {
    "Default/scaled_loss-ScaledLoss/loss_net-TrainLoss/loss_net-MlmLoss/model-BertMLM/head-MaskedLMHead/MatMul-op0":
        "matmul",
    "Gradients/Default/scaled_loss-ScaledLoss/loss_net-TrainLoss/loss_net-MlmLoss/model-BertMLM/layers-CellList/"
    "0-EncoderLayer/Grad_BatchMatMul/BatchMatMul-op2": "attention",
    "Expand/_SoftmaxBackward/ReduceSum-op0": "attention",
    "Default/scaled_loss-ScaledLoss/loss_net-TrainLoss/loss_net-MlmLoss/loss-CrossEntropy/ReduceMax-op0": "softmax",
    "Default/optimizer-AdamW/Addcmul-op0": "optimizer",
    "Gradients/Default/scaled_loss-ScaledLoss/loss_net-TrainLoss/loss_net-MlmLoss/model-BertMLM/layers-CellList/"
    "0-EncoderLayer/Grad_GeLU/GeLUGrad-op0": "activation",
    "Default/TensorMove-op3": "data_movement",
    "Gradients/Default/AddN-op0": "elementwise",
}


@pytest.mark.parametrize("module, names", [
    ("backends.torch_common.profile", TORCH_NAMES), ("backends.tf_mirrored.profile", TF_NAMES),
    ("backends.keras_jax.profile", JAX_NAMES), ("backends.mindspore_auto.profile", MINDSPORE_NAMES)],
    ids=["torch", "tensorflow", "jax", "mindspore"])
def test_each_frameworks_table_classifies_its_own_op_names(module, names):
    import importlib

    classify = Classifier(importlib.import_module(module).RULES)
    assert {path: classify(path) for path in names} == names


def _record(backend: str, framework: str, shares: dict[str, float], step_s: float) -> dict:
    categories = {c: {"seconds": shares.get(c, 0.0) * step_s, "share": shares.get(c, 0.0)}
                  for c in ATTRIBUTION_CATEGORIES}
    section = {"step_s": step_s, "wall_step_s": step_s, "measured_step_s": step_s * 0.9, "steps": 2,
               "categories": categories, "profiler": "test", "trace_dir": "/tmp"}
    return {"status": "ok", "backend": backend, "framework": framework, "workload": "mlm", "devices": 1,
            "global_batch": 32, "config": {"model_size": "tiny", "precision": "fp32"}, "started_at": "2026",
            "layout": {"dp": 1, "tp": 1, "pp": 1}, "backend_metrics": {"attribution": section}}


def test_the_report_stacks_each_backend_and_names_the_largest_gap_between_frameworks():
    torch = _record("torch_ddp", "pytorch", {"matmul": 0.5, "softmax": 0.1, "host_idle": 0.4}, 1.0)
    tf = _record("tf_mirrored", "tensorflow", {"matmul": 0.4, "softmax": 0.3, "host_idle": 0.3}, 2.0)
    # torch_dp's matmul is 700 ms above torch_ddp's, but they are one framework: not compared.
    dp = _record("torch_dp", "pytorch", {"matmul": 0.5, "softmax": 0.25, "host_idle": 0.25}, 2.4)
    assert row_key(torch) == row_key(tf)
    words = largest_difference({"torch_ddp": torch, "tf_mirrored": tf, "torch_dp": dp})
    # other compute: 0.6 s against 0.1 s
    assert words.startswith("other compute: 600 ms per step in tf_mirrored (tensorflow, 30% of its 2000 ms step)")
    assert "against 100 ms in torch_ddp" in words and "a difference of 500 ms where the two steps differ by +1000 ms" \
        in words
    blocks = attribution_blocks([torch, tf, dp])
    [table] = [b for b in blocks if isinstance(b, Table)]
    rows = {row[1]: dict(zip(table.columns, row)) for row in table.rows}
    assert rows["tf_mirrored"]["other compute ms"] == "600 (30%)" and rows["torch_ddp"]["matmul ms"] == "500 (50%)"
    assert any(isinstance(b, Image) and b.png for b in blocks)
    assert any(isinstance(b, Text) and "Largest difference" in b.text and "other compute" in b.text for b in blocks)
    assert group_seconds(Attribution.from_metrics(tf["backend_metrics"]))["host/idle"] == pytest.approx(0.6)


def test_profile_takes_a_default_number_of_steps_and_a_sweep_passes_it_on(tmp_path):
    from bench.cli import forwarded
    from bench.run import build_config, build_parser
    from common.profile import DEFAULT_STEPS, PROFILES

    parse = build_parser().parse_args
    base = ["--backend", "torch_ddp", "--workload", "cnn", "--devices", "1", "--out", str(tmp_path)]
    assert parse([*base, "--profile"]).profile == DEFAULT_STEPS and parse(base).profile == 0
    args = parse([*base, "--profile", "2", "--data", "synthetic"])
    assert forwarded(args, ())[forwarded(args, ()).index("--profile") + 1] == "2"

    class Plan:
        kind, virtual, threads_per_device = "cpu", True, 1
    cfg = build_config(args, "run-1", Plan())
    assert (cfg.profile_steps, cfg.profile_dir) == (2, str((tmp_path / PROFILES).resolve()))
    assert cfg.feed_steps == cfg.total_steps + 2  # the data feed serves the profiled steps too


HLO = """HloModule jit__step, entry_computation_layout={(f32[8,4]{1,0})->f32[8,4]{1,0}}

%fused_computation (param_0: f32[8,4], param_1: f32[4,4]) -> f32[8,4] {
  %param_0 = f32[8,4]{1,0} parameter(0)
  %param_1 = f32[4,4]{1,0} parameter(1)
  %dot.1 = f32[8,4]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %add.2 = f32[8,4]{1,0} add(%dot.1, %dot.1)
}

ENTRY %main.9 (x: f32[8,4]) -> f32[8,4] {
  %x = f32[8,4]{1,0} parameter(0)
  %w = f32[4,4]{1,0} constant({...})
  %fusion.12 = f32[8,4]{1,0} fusion(%x, %w), kind=kOutput, calls=%fused_computation, """ \
    """metadata={op_name="jit(_step)/jvp(mlm_head)/dense/dot_general" source_file="x.py"}
  ROOT %copy.3 = f32[8,4]{0,1} copy(%fusion.12), metadata={op_name="jit(_step)/transpose(jvp())/add_any"}
}
"""


def test_an_xla_event_is_described_by_what_its_fusion_runs_and_its_scope():
    from backends.keras_jax.hlo import describe

    described = describe(HLO)
    assert described["fusion.12"] == "fusion.12 [add,dot] @jit(_step)/jvp(mlm_head)/dense/dot_general"
    assert described["copy.3"] == "copy.3 [copy] @jit(_step)/transpose(jvp())/add_any"
    classify = Classifier(__import__("backends.keras_jax.profile", fromlist=["RULES"]).RULES)
    assert (classify(described["fusion.12"]), classify(described["copy.3"])) == ("matmul", "data_movement")


def test_a_sweep_speaks_of_threads_per_virtual_cpu_only_where_its_devices_are_cpus(monkeypatch):
    """Issue #30: a GPU sweep printed "16 thread(s) per virtual CPU device"."""
    from common import devices

    assert devices.threads_phrase(16, "cuda") == ""
    assert devices.threads_phrase(2, "cpu") == ", 2 thread(s) per virtual CPU device"
    monkeypatch.setattr(devices, "accelerator_driver_present", lambda: True)
    assert devices.threads_phrase(16, "auto") == ""
    monkeypatch.setattr(devices, "accelerator_driver_present", lambda: False)
    assert devices.threads_phrase(1, "auto") == ", 1 thread(s) per virtual CPU device"


# ----------------------------------------------------------------------------- every figure of a section, by hand

HAND_RULES = (("optimizer", r"Optimizer"), ("matmul", r"mm$"), ("attention", r"attn$"), ("all_reduce", r"allreduce$"),
              ("elementwise", r"add$"), ("host_idle", r"wrapper$"))


def test_a_section_of_two_steps_worked_by_hand():
    """Steps 0-4 and 10-14. Step 1: mm 1 s (4e9 FLOPs), attn 0.5 s, idle 0.5, foo 1 s, idle 1. Step 2: allreduce
    1 s, idle 1, bar 1.5 s, baz 0.25 s, idle 0.25. An mm starting at 4.0, the first step's end, is outside it:
    neither its time nor its FLOPs count."""
    events = [OpEvent("mm", 0.0, 1.0, "t", flops=4e9), ev("attn", 1.0, 1.5, "t"), ev("foo", 2.0, 3.0, "t"),
              OpEvent("mm", 4.0, 5.0, "t", flops=8e9), ev("allreduce", 10.0, 11.0, "t"),
              ev("bar", 12.0, 13.5, "t"), ev("baz", 13.5, 13.75, "t")]
    section = attribution(events, [(0.0, 4.0), (10.0, 14.0)], Classifier(HAND_RULES), wall_step_s=4.5,
                          measured_step_s=3.9, profiler="hand", trace_dir="/traces/r1", model_flops_per_step=6e9,
                          bytes_per_step={"all_reduce": 3e9, "matmul": 0.0})
    per_step = {"matmul": 0.5, "attention": 0.25, "all_reduce": 0.5, "other": 1.375, "host_idle": 1.375}
    assert (section.step_s, section.wall_step_s, section.measured_step_s, section.steps) == (4.0, 4.5, 3.9, 2)
    assert (section.profiler, section.trace_dir) == ("hand", "/traces/r1")
    assert {c: t.seconds for c, t in section.categories.items() if t.seconds} == pytest.approx(per_step)
    assert {c: t.share for c, t in section.categories.items() if t.share} == pytest.approx(
        {c: s / 4.0 for c, s in per_step.items()})
    # 4e9 FLOPs over 2 steps in 0.5 s of matmul per step; 3e9 bytes per step in 0.5 s of all-reduce.
    assert {c: t.flops_per_s for c, t in section.categories.items() if t.flops_per_s is not None} == {"matmul": 4e9}
    assert {c: t.bytes_per_s for c, t in section.categories.items() if t.bytes_per_s is not None} == {
        "all_reduce": 6e9}
    assert section.model_flops_per_s_in_matmul == pytest.approx(6e9 / 0.75)  # matmul + attention: 0.75 s a step
    assert section.unclassified == [["bar", 0.75], ["foo", 0.5], ["baz", 0.125]]  # largest first, per step
    assert section.op_concurrency == 1.0


def test_a_section_with_no_events_is_all_host_idle():
    section = attribution([], [(0.0, 2.0)], Classifier(HAND_RULES), wall_step_s=2.0, measured_step_s=None,
                          profiler="hand", trace_dir="")
    assert {c: t.seconds for c, t in section.categories.items() if t.seconds} == {"host_idle": 2.0}
    assert section.categories["host_idle"].share == 1.0 and section.categories["matmul"].share == 0.0
    assert section.op_concurrency is None and section.unclassified == [] and section.model_flops_per_s_in_matmul is None
    # A window of no length has no shares to give.
    empty = attribution([], [(1.0, 1.0)], Classifier(HAND_RULES), wall_step_s=0.0, measured_step_s=None,
                        profiler="hand", trace_dir="")
    assert {t.share for t in empty.categories.values()} == {0.0}


def test_the_same_op_on_two_threads_takes_its_share_of_each_instant():
    """foo on threads a and b over 0-3, add on c over 1-3: 0-1 is foo's alone (1 s), in 1-3 foo holds 2 of the 3
    working threads (4/3 s) and add 1 (2/3 s); 3-4 is idle."""
    events = [ev("foo", 0.0, 3.0, "a"), ev("foo", 0.0, 3.0, "b"), ev("add", 1.0, 3.0, "c")]
    seconds, unclassified, flops, concurrency = split_time(events, [(0.0, 4.0)], Classifier(HAND_RULES))
    assert seconds == pytest.approx({"other": 7 / 3, "elementwise": 2 / 3, "host_idle": 1.0})
    assert unclassified == pytest.approx({"foo": 7 / 3})
    assert flops == {} and concurrency == pytest.approx(8 / 3)  # 2 threads for 1 s, 3 for 2 s


def test_a_step_that_is_all_work_has_no_idle_entry():
    seconds, _, _, concurrency = split_time([ev("mm", 0.0, 1.0, "a"), ev("add", 1.0, 2.0, "b")], [(0.0, 2.0)],
                                            Classifier(HAND_RULES))
    assert seconds == {"matmul": 1.0, "elementwise": 1.0} and concurrency == 1.0


def test_flops_add_up_per_category_and_only_for_events_that_last():
    events = [OpEvent("mm", 0.0, 1.0, "t", flops=4e9), OpEvent("mm", 1.0, 2.0, "t", flops=2e9),
              OpEvent("add", 2.0, 3.0, "t"), OpEvent("mm", 2.5, 2.5, "t", flops=5e9)]  # no length: not an op run
    seconds, _, flops, _ = split_time(events, [(0.0, 4.0)], Classifier(HAND_RULES))
    assert flops == {"matmul": 6e9}
    assert seconds == {"matmul": 2.0, "elementwise": 1.0, "host_idle": 1.0}


def test_an_event_opened_with_its_parent_is_inside_it_and_cut_at_its_end():
    # Optimizer and mm start together: the longer one encloses the other, so the mm is the optimizer's.
    seconds, *_ = split_time([ev("Optimizer", 0.0, 4.0), ev("mm", 0.0, 1.0)], [(0.0, 4.0)], Classifier(HAND_RULES))
    assert seconds == {"optimizer": 4.0}
    # An mm that outlives its wrapper is cut at the wrapper's end; after it nothing runs.
    seconds, *_ = split_time([ev("wrapper", 0.0, 2.0), ev("mm", 1.0, 3.0)], [(0.0, 4.0)], Classifier(HAND_RULES))
    assert seconds == {"host_idle": 3.0, "matmul": 1.0}
