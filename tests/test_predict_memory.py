"""common.predict.memory on a toy BERT counted by hand (h 2, intermediate 4, 2 positions, vocabulary 10, 3
layers: tests/test_stage_split.py's): what each rank holds, its activations and an evaluation's live values."""
from __future__ import annotations

from dataclasses import replace

import pytest

from common.initial_weights import layout as tensor_layout
from common.layout import Layout
from common.predict.decoder import DecoderSpec
from common.predict.memory import (
    activation_bytes,
    evaluation_bytes,
    framework_of,
    fsdp_numel,
    in_flight,
    layer_elements,
    stage_params,
    stage_tensors,
    state_bytes,
    tp_shape,
    transient_bytes,
    value_bytes,
)
from common.spec import BERT_SIZES, CNN, BertSpec

TOY = BertSpec("toy", layers=3, hidden=2, heads=1, intermediate=4, seq_len=2, vocab_size=10)
EMBEDDINGS, LAYER, HEAD, TOKEN = 32, 54, 20, 20   # elements: (10 + 2 + 2) x 2 + 4; a layer; the head; 10 x 2
PP2 = Layout(pp=2, micro_batches=4)               # the even split: layers 0-1, then layer 2 and the head


def _shape(name: str, layout: Layout) -> tuple[int, ...]:
    return tp_shape(next(t for t in tensor_layout(TOY) if t.name == name), layout)


def test_a_tensor_parallel_shard_by_module():
    tp2, split = Layout(tp=2), Layout(tp=2, vocab_split=True)
    assert _shape("layers.0.attention.query.weight", tp2) == (1, 2) and _shape("layers.0.ffn.in.bias", tp2) == (2,)
    assert _shape("layers.1.attention.output.weight", tp2) == (2, 1) and _shape("layers.1.ffn.out.weight", tp2) == \
        (2, 2)
    assert _shape("layers.1.attention.output.bias", tp2) == (2,) and _shape("layers.2.ffn_norm.gamma", tp2) == (2,)
    assert _shape("embeddings.token", tp2) == (10, 2) and _shape("head.bias", tp2) == (10,)
    assert _shape("embeddings.token", split) == (5, 2) and _shape("head.bias", split) == (5,)
    assert _shape("head.dense.weight", split) == (2, 2) and _shape("layers.0.attention.query.weight", Layout()) == \
        (2, 2)
    # Q, K, V and FFN-in by rows (3 x 3 + 6), output and FFN-out by columns (2 + 2, 4 + 2), norms 8: 33 of 54
    assert layer_elements(TOY, Layout()) == LAYER and layer_elements(TOY, tp2) == 33
    # a one-layer model has its one layer's elements (layer 0: there is no layer 1 to count)
    assert layer_elements(replace(TOY, layers=1), Layout()) == LAYER


def test_what_each_pipeline_stage_holds():
    first, last = (sorted({t.name.split(".")[0] + ("" if not t.name.startswith("layers") else t.name.split(".")[1])
                           for t in stage_tensors(TOY, PP2, s)}) for s in (0, 1))
    assert first == ["embeddings", "layers0", "layers1"] and last == ["embeddings", "head", "layers2"]
    assert [t.name for t in stage_tensors(TOY, PP2, 1) if t.name.startswith("embeddings")] == ["embeddings.token"]
    assert stage_params(TOY, PP2, 0) == EMBEDDINGS + 2 * LAYER and stage_params(TOY, PP2, 1) == LAYER + HEAD + TOKEN
    assert stage_params(TOY, replace(PP2, stage_split="1,2"), 0) == EMBEDDINGS + LAYER
    assert stage_params(TOY, Layout(), 0) == EMBEDDINGS + 3 * LAYER + HEAD == TOY.param_count()
    assert len(stage_tensors(CNN, Layout(pp=2, micro_batches=2), 1)) == len(stage_tensors(CNN, Layout(), 0))


def test_state_bytes_by_hand():
    def adamw(elements, counters):
        return {"params": 4 * elements, "grads": 4 * elements, "optimizer": 8 * elements + counters}
    assert vars(state_bytes(TOY, PP2, 0)) == adamw(EMBEDDINGS + 2 * LAYER, 4 * (5 + 2 * 16))
    assert vars(state_bytes(TOY, PP2, 1)) == adamw(LAYER + HEAD + TOKEN, 4 * (16 + 5 + 1))
    assert vars(state_bytes(TOY, PP2, 1, backend="keras_jax")) == adamw(LAYER + HEAD + TOKEN, 8)
    assert framework_of("tf_mirrored") == framework_of("keras_jax") == "keras" and framework_of("torch_ddp") == "torch"
    # FSDP over 3: every tensor cut by torch.chunk along its first dimension
    fsdp = Layout(fsdp=3)
    per_rank = [state_bytes(TOY, fsdp, r).params // 4 for r in range(3)]
    assert sum(per_rank) == TOY.param_count() and per_rank == [sum(fsdp_numel(t.shape, 3, r) for t in
                                                                   tensor_layout(TOY)) for r in range(3)]
    assert [fsdp_numel((4, 3), 2, i) for i in range(2)] == [6, 6] and [fsdp_numel((1,), 2, i) for i in (0, 1)] == \
        [1, 0]
    assert fsdp_numel((7, 2), 3, 2) == 2 and fsdp_numel((9,), 1, 0) == 9


def test_activations_by_hand():
    """Per sample and layer s(4h + (4h + 2i)/tp) = 2 x (8 + 16) = 48 values; the embeddings 2sh = 8; the head
    4ph + 2pV = 8 + 20; float32; micro-batches of 3."""
    assert value_bytes("amp") == value_bytes("fp16") == 2 and value_bytes("fp32") == value_bytes(None) == 4
    assert activation_bytes(TOY, Layout(), 0, 3) == 4 * 3 * (3 * 48 + 8 + 28)
    assert activation_bytes(TOY, Layout(), 0, 3, value_bytes=2) == 2 * 3 * (3 * 48 + 8 + 28)
    # --recompute: each layer's input (s x h = 4) kept, one layer's values rebuilt at a time
    assert activation_bytes(TOY, Layout(recompute="full"), 0, 3) == 4 * 3 * (3 * 4 + 48 + 8 + 28)
    # tp 2 with the vocabulary split: 2 x (8 + 8) = 32 a layer, the logits halved
    assert activation_bytes(TOY, Layout(tp=2, vocab_split=True), 0, 3) == 4 * 3 * (3 * 32 + 8 + 8 + 10)
    assert activation_bytes(TOY, Layout(tp=2), 0, 3) == 4 * 3 * (3 * 32 + 8 + 8 + 20)
    # a pipeline: GPipe keeps all 4 micro-batches, 1F1B pp - stage of them
    assert in_flight(Layout(), 0) == 1 and in_flight(PP2, 1) == 4
    one_f = Layout(pp=2, micro_batches=4, schedule="1f1b")
    assert (in_flight(one_f, 0), in_flight(one_f, 1)) == (2, 1)
    assert activation_bytes(TOY, PP2, 0, 3) == 4 * 3 * 4 * (2 * 48 + 8)
    assert activation_bytes(TOY, PP2, 1, 3) == 4 * 3 * 4 * (48 + 28)
    assert activation_bytes(TOY, one_f, 0, 3) == 4 * 3 * 2 * (2 * 48 + 8)
    assert activation_bytes(TOY, Layout(pp=3, micro_batches=3, recompute="full", stage_split="2,0,1"), 1, 1) == 0
    # the CNN: each conv's output and its BatchNorm and ReLU copies, then the fully connected inputs
    maps = sum(3 * size * size * c for size, c in zip((26, 24, 10, 8), (16, 32, 64, 128)))
    assert activation_bytes(CNN, Layout(), 0, 2) == 4 * 2 * (maps + 2048 + 1024 + 128)
    assert activation_bytes(CNN, Layout(), 0, 2, value_bytes=2) == 2 * 2 * (maps + 2048 + 1024 + 128)  # autocast


def test_an_evaluation_keeps_one_layer_or_the_logits():
    assert evaluation_bytes(TOY, Layout(), 0, 5) == 4 * 5 * 2 * (8 + 12)          # one layer's 40 values
    wide = BertSpec("wide", layers=3, hidden=2, heads=1, intermediate=4, seq_len=2, vocab_size=100)
    assert evaluation_bytes(wide, Layout(), 0, 5) == 4 * 5 * 200                    # the logits: 2pV
    assert evaluation_bytes(wide, Layout(tp=2, vocab_split=True), 0, 5) == 4 * 5 * 100
    assert evaluation_bytes(wide, Layout(tp=2), 0, 5) == 4 * 5 * 200
    assert evaluation_bytes(wide, PP2, 0, 5) == 4 * 5 * 40 and evaluation_bytes(wide, PP2, 1, 5) == 4 * 5 * 200
    assert evaluation_bytes(CNN, Layout(), 0, 6) == pytest.approx(activation_bytes(CNN, Layout(), 0, 6) / 3)


def test_the_buffers_a_step_adds():
    assert transient_bytes(TOY, Layout(), 0) == 0 and transient_bytes(TOY, Layout(dp=2), 0) == 4 * TOY.param_count()
    assert transient_bytes(TOY, Layout(fsdp=2), 0) == 4 * 2 * LAYER
    # ZeRO-2: the stage's 3 layers whole by the end of its forward; a stage of 1 layer still holds 2 (prefetch)
    assert transient_bytes(TOY, Layout(fsdp=2, zero2=True), 0) == 4 * 3 * LAYER
    assert transient_bytes(TOY, Layout(fsdp=2, pp=2, micro_batches=2, zero2=True, stage_split="2,1"), 1) == \
        4 * 2 * LAYER
    assert transient_bytes(TOY, Layout(fsdp=1), 0) == 0
    assert transient_bytes(CNN, Layout(fsdp=2), 0) == 0
    assert transient_bytes(TOY, Layout(dp=2, pp=2, micro_batches=2), 1) == 4 * (LAYER + HEAD + TOKEN)


def test_an_evaluation_under_tensor_parallel():
    assert evaluation_bytes(TOY, Layout(tp=2), 0, 5) == 4 * 5 * 2 * (8 + 12 / 2)  # Q, K, V, FFN split: 28 a sample


def test_a_shard_is_whole_elements_and_recompute_keeps_one_split_layer():
    # Shapes are element counts (state bytes go to validation.json beside a run's integer counts); a vocabulary
    # that tp does not divide (33,282 words over 4) keeps floor(V / tp) rows per rank
    mini, tp4 = BERT_SIZES["mini"], Layout(tp=4, vocab_split=True)
    shapes = {t.name: tp_shape(t, tp4) for t in tensor_layout(mini)}
    assert all(type(d) is int for shape in shapes.values() for d in shape)
    assert shapes["embeddings.token"] == (33_282 // 4, 256) == (8320, 256)
    # TOY under --recompute at tp2, per sample: three layers' inputs (s h = 4 each), the layer being recomputed
    # whole, its split part halved (2 x (4 h + (4 h + 2 i) / 2) = 32), the embeddings' 2 s h = 8, the head's
    # 4 p h + 2 p V = 28: 80 values of 4 bytes
    assert activation_bytes(TOY, Layout(tp=2, recompute="full"), 0, 1) == 4 * (12 + 32 + 8 + 28)


# A decoder small enough to count by hand: h 4, 2 heads of 2 (one key/value head), SwiGLU FFN 8, vocabulary 10,
# 2 tokens a sequence, 2 layers. One layer keeps, per token in float32: the two norms' inputs 2 x 16, the QKV
# input 16, Q, K and V 4 x (4 + 2 + 2), the log-sum-exp 4 x 2, the output projection's input 16, the FFN's input
# 16, SwiGLU's four 8-wide values 4 x 4 x 8: 248 bytes, 496 a sequence.
DECODER = DecoderSpec("toy-lm", layers=2, hidden=4, heads=2, kv_heads=1, ffn=8, ffn_kind="swiglu", vocab=10,
                      seq_len=2, tied_embeddings=False)
LOGITS = 4 * 2 * 10            # one float32 vocabulary-wide tensor a sequence
LAST = 4 * 2 * 2 * 4 + LOGITS  # the final norm's input and output (2 x 2 tokens x 4) and log-softmax's output


@pytest.mark.parametrize("layout, stage, value, expected", [
    (Layout(), 0, 4, 3 * (2 * 496 + LAST + 2 * LOGITS)),                  # 3888: the loss's two tensors once
    (Layout(recompute="full"), 0, 4, 3 * (2 * 4 * 2 * 4 + 496 + LAST + 2 * LOGITS)),   # inputs + one layer: 2592
    (Layout(pp=2, micro_batches=4), 0, 4, 3 * 4 * 496),                   # GPipe: all 4 in flight, no loss
    (Layout(pp=2, micro_batches=4), 1, 4, 3 * (4 * (496 + LAST) + 2 * LOGITS)),         # 8160
    (Layout(pp=2, micro_batches=4, schedule="1f1b"), 0, 4, 3 * 2 * 496),  # 1F1B: pp - stage in flight
    (Layout(pp=2, micro_batches=4, schedule="1f1b"), 1, 4, 3 * (496 + LAST + 2 * LOGITS)),  # 2400
    # tp2: Q, K, V, the log-sum-exp, the context and SwiGLU split: 156 bytes a token, 312 a sequence
    (Layout(tp=2), 0, 4, 3 * (2 * 312 + LAST + 2 * LOGITS)),              # 2784
    (Layout(tp=2, vocab_split=True), 0, 4, 3 * (2 * 312 + 64 + 40 + 2 * 40)),   # the logits split too: 2424
    # bf16 values: 128 bytes a token (the log-sum-exp stays float32), the logits' tensors stay float32
    (Layout(), 0, 2, 3 * (2 * 256 + 2 * 2 * 2 * 4 + LOGITS + 2 * LOGITS)),     # 2352
    # a stage left without layers (3 stages of 2 layers, which validate refuses) recomputes none
    (Layout(pp=3, micro_batches=3, recompute="full"), 2, 4, 3 * (3 * LAST + 2 * LOGITS)),   # 1776
])
def test_the_executed_decoders_activations_by_hand(layout, stage, value, expected):
    """Micro-batches of 3 sequences of the executed decoder LM (lm): its layers' stored values per micro-batch in
    flight, the last stage's norm and log-softmax outputs with them, and once the loss's two float32 gradients."""
    assert DECODER.stored_activation_bytes(2, 1, value_bytes=4) == 496
    assert activation_bytes(DECODER, layout, stage, 3, value) == pytest.approx(expected, rel=1e-12)


def test_micro_batches_in_flight_by_schedule():
    """GPipe holds every micro-batch (of the layout's, or of those asked about); 1F1B pp - stage of them at most;
    interleaved 1F1B on v chunks pp (1 + (pp - 1) / (pp v)): 2 x (1 + 1/4) = 2.5 for pp2 of 2 chunks, 4 x (1 + 3/8)
    = 5.5 for pp4, never more than there are."""
    assert in_flight(PP2, 0, micro_batches=6) == 6 and in_flight(Layout(), 0, micro_batches=6) == 1
    assert in_flight(Layout(pp=4, micro_batches=2, schedule="1f1b"), 0) == 2
    assert in_flight(Layout(pp=4, micro_batches=8, schedule="1f1b"), 1) == 3
    interleaved = Layout(pp=2, micro_batches=4, schedule="interleaved", virtual_stages=2)
    assert in_flight(interleaved, 0) == 2.5 and in_flight(interleaved, 1) == 2.5
    assert in_flight(interleaved, 0, micro_batches=2) == 2
    assert in_flight(Layout(pp=4, micro_batches=8, schedule="interleaved", virtual_stages=2), 0) == 5.5


def test_an_evaluation_of_the_executed_decoder_keeps_one_layer_or_the_logits():
    """Per sequence of 2 tokens, float32: a layer's 4h = 16 values and Q, K, V and three FFN-wide ones, (4 + 2 x 2
    + 3 x 8) / tp; the last stage's logits and log-softmax 2 x 2 x V, the more of the two; batches of 5."""
    assert evaluation_bytes(DECODER, Layout(), 0, 5) == 4 * 5 * 2 * (16 + 32)            # 96 > the logits' 40
    wide = replace(DECODER, vocab=100)                                                   # logits 400 a sequence
    assert evaluation_bytes(wide, Layout(), 0, 5) == 4 * 5 * 400
    assert evaluation_bytes(wide, Layout(tp=2), 0, 5) == 4 * 5 * 400
    assert evaluation_bytes(wide, Layout(tp=2, vocab_split=True), 0, 5) == 4 * 5 * 200
    assert evaluation_bytes(DECODER, Layout(tp=2), 0, 5) == 4 * 5 * 2 * (16 + 16)
    pp2 = Layout(pp=2, micro_batches=2)
    assert evaluation_bytes(wide, pp2, 0, 5) == 4 * 5 * 96 and evaluation_bytes(wide, pp2, 1, 5) == 4 * 5 * 400


def test_the_mlm_head_keeps_its_values_at_each_masked_position():
    """8 tokens a sequence mask ceil(0.15 x 8) = 2 positions: the head keeps 4 p h = 16 values and the logits and
    their softmax 2 p V = 40, against the first stage's embeddings 2 s h = 32; one layer on each stage of pp2,
    GPipe's 2 micro-batches of 1 in flight, float32: the last stage holds 4 x 2 x (56 - 32) = 192 bytes more."""
    toy8 = BertSpec("toy8", layers=2, hidden=2, heads=1, intermediate=4, seq_len=8, vocab_size=10)
    assert toy8.max_predictions == 2
    pp2 = Layout(pp=2, micro_batches=2)
    assert activation_bytes(toy8, pp2, 1, 1) - activation_bytes(toy8, pp2, 0, 1) == 4 * 2 * (16 + 40 - 32)
    # the logits split over tp2: half of 2 p V
    assert activation_bytes(toy8, Layout(tp=2), 0, 1) - activation_bytes(toy8, Layout(tp=2, vocab_split=True), 0, 1) \
        == 4 * 20


def test_an_evaluation_of_the_mlm_keeps_the_logits_of_each_masked_position():
    """8 tokens mask 2 positions: the logits and their softmax 2 p V = 400 a sequence over a 100-word vocabulary,
    more than a layer's s (4h + (2h + 2i)/tp) = 8 x 20 = 160; batches of 5, float32."""
    toy8 = BertSpec("toy8", layers=2, hidden=2, heads=1, intermediate=4, seq_len=8, vocab_size=100)
    assert evaluation_bytes(toy8, Layout(), 0, 5) == 4 * 5 * 400
    assert evaluation_bytes(toy8, Layout(pp=2, micro_batches=2), 0, 5) == 4 * 5 * 160
