"""One step model (common.predict.step.predict): the CPU validation of parbench's own runs, the check against
published GPU clusters and both plans (the executed workloads' and a decoder's) reach the same step function, and
no second one exists in the tree (only it builds a Prediction). One model protocol (common.spec.Model): every
model's FLOPs counted once, from its GEMMs and attention."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from common.layout import Layout
from common.plan.rank import predicted
from common.predict import decoder, memory, published, stacks, step
from common.predict import hardware as hardware_files
from common.predict.basis import from_mfu
from common.predict.kernels import device_compute
from common.predict.validation import validate
from common.spec import BERT_SIZES, CNN, attention_flops, forward_flops, training_flops_per_sample
from tests.conftest import REPO
from tests.test_predict_validation import H100, _known_folder


def test_the_validation_the_published_check_and_both_plans_reach_one_step_function(monkeypatch):
    reached: list[str] = []
    real = step._step

    def recording(stages, layout, global_batch):
        reached.append("decoder" if stages.seq_len else "executed")
        return real(stages, layout, global_batch)
    monkeypatch.setattr(step, "_step", recording)

    def since(before: int) -> set[str]:
        return set(reached[before:])
    validation = validate(_known_folder(), H100)                 # bench.predict --validate: dp2 and dp4
    assert len(validation["runs"]) == 2 and since(0) == {"executed"} and len(reached) >= 2
    before = len(reached)
    point = next(p for p in published.all_points() if p.stack == "megatron-te")   # bench.predict --published
    assert published.predict_point(point)["predicted"] and since(before) == {"decoder"}
    before = len(reached)
    cpu = hardware_files.load("cpu-loopback-2core")              # bench.plan --from / --assume-mfu
    rows = predicted(BERT_SIZES["tiny"], [Layout(dp=2), Layout(tp=2)], 32, cpu,
                     from_mfu(0.4, cpu, "fp32", achievable=1e11), 1e12, None, backend="torch_3d")
    assert len(rows) == 2 and since(before) == {"executed"}
    before = len(reached)
    h100 = hardware_files.load("h100-sxm-8")                     # bench.plan --model, a table and an assumed MFU
    for compute in (device_compute(h100), device_compute(h100, 0.4)):
        predicted(decoder.load("llama3-8b"), [Layout.parse("fsdp8-mbs1", 8)], 8, h100, compute, h100.memory_bytes,
                  None, stack=stacks.load("torch-compile"))
    assert since(before) == {"decoder"} and len(reached) == before + 2


def test_no_second_step_function_exists():
    """A Prediction is built in one place: step._step. Any other step model would have to build its own. (Under
    `nox -s mutation` the tree is mutmut's copy: its copies of _step, named __mutmut_, are no second model.)"""
    builders = []
    for path in sorted((REPO / "common").rglob("*.py")) + sorted((REPO / "bench").rglob("*.py")) + \
            sorted((REPO / "backends").rglob("*.py")):
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef) or "__mutmut_" in function.name:
                continue
            builders += [f"{Path(path).relative_to(REPO)}:{function.name}" for node in ast.walk(function)
                         if isinstance(node, ast.Call)
                         and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Prediction"]
    assert builders == ["common/predict/step.py:_step"], builders


def test_every_model_s_flops_are_counted_once_from_its_gemms_and_attention():
    """The record's FLOPs (training_flops_per_sample: its MFU) of the three models, by hand: a layer's linear
    layers 2 x in x out a token, attention 2 x 2 x s x width a token (half under a decoder's causal mask), the
    CNN's convs 2 x out pixels x cout x cin x 9; forward + backward 3 x forward."""
    tiny = BERT_SIZES["tiny"]
    h, i, s, p, v = tiny.hidden, tiny.intermediate, tiny.seq_len, tiny.max_predictions, tiny.vocab_size
    layer = 2 * s * (4 * h * h + 2 * h * i) + 4 * s * s * h
    assert training_flops_per_sample(tiny) == 3 * (tiny.layers * layer + 2 * p * (h * h + h * v))
    llama = decoder.load("llama3-8b")
    h, s, q, kv, f = llama.hidden, llama.seq_len, llama.q_width, llama.kv_width, llama.ffn
    per_token = 2 * (llama.layers * (h * (q + 2 * kv) + q * h + 3 * h * f) + h * llama.vocab) \
        + llama.layers * 4 * s * q / 2
    assert training_flops_per_sample(llama) == pytest.approx(3 * s * per_token, rel=1e-12)
    convs = [(26, 1, 16), (24, 16, 32), (10, 32, 64), (8, 64, 128)]     # output size, cin, cout
    fcs = [(2048, 1024), (1024, 128), (128, 10)]
    assert training_flops_per_sample(CNN) == 3 * 2 * (sum(n * n * co * ci * 9 for n, ci, co in convs)
                                                     + sum(a * b for a, b in fcs))
    # the predictor times a decoder's attention at the same count the record makes
    layout = Layout.parse("tp2", 2)
    assert forward_flops(llama, 2) == pytest.approx(sum(g.flops for g in llama.gemms(2))
                                                    + llama.layers * attention_flops(2 * s, s, q, causal=True))
    assert llama.layer_gemms(s, layout.tp)[0].n == q // 2


def test_every_model_describes_what_a_layer_keeps_for_its_backward_and_memory_reads_it():
    """BERT's layer: 4h replicated + (4h + 2i) / tp values a token (the CNN's body, per sample); the memory model's
    activations are those layers' (inputs only under recompute, plus the layer being recomputed)."""
    tiny = BERT_SIZES["tiny"]
    h, i, s = tiny.hidden, tiny.intermediate, tiny.seq_len
    assert tiny.stored_activation_bytes(s, 2) == 4 * s * (4 * h + (4 * h + 2 * i) / 2)
    assert CNN.stored_activation_bytes(3, value_bytes=2) == 2 * 3 * (3 * (26 * 26 * 16 + 24 * 24 * 32 + 10 * 10 * 64
                                                                        + 8 * 8 * 128) + 2048 + 1024 + 128)
    with pytest.raises(ValueError, match="sequence parallelism"):
        tiny.stored_activation_bytes(s, 2, sequence_parallel=True)
    plain, again = (memory.activation_bytes(tiny, Layout(tp=2, recompute=rc), 0, 1) for rc in ("none", "full"))
    ends = 4 * (2 * s * h + 4 * tiny.max_predictions * h + 2 * tiny.max_predictions * tiny.vocab_size)
    assert plain - ends == tiny.layers * tiny.stored_activation_bytes(s, 2)
    assert again - ends == tiny.layers * 4 * s * h + tiny.stored_activation_bytes(s, 2)
