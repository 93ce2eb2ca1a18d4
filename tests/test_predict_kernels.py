"""common.predict.kernels worked by hand: a made-up decoder small enough to count (4 layers, hidden 8, 2 heads, one KV
head, FFN 16, vocabulary 32, 4 tokens a sequence) on a made-up device whose every rate is one figure (GEMMs at
1 TFLOP/s, attention at 2 forward and 4 backward, memory at 1e12 B/s, no launch floor), so that each kernel's time
is its FLOPs or bytes in picoseconds, and links of round figures (node: 1 GB/s and 1 us a step; network: 0.5 GB/s
and 10 us). Unit tests only: no process is started."""
from __future__ import annotations

from dataclasses import replace

import pytest

from common.layout import Layout
from common.predict import kernels, stacks
from common.predict.basis import Basis
from common.predict.collectives import Collective
from common.predict.decoder import DecoderSpec
from common.predict.gpu_compute import AttentionRates, DeviceCompute, MatmulTable, arguments_of
from common.predict.hardware import Hardware, Link
from common.predict.kernels import Timer
from common.predict.memory import decoder_rank_bytes
from common.spec import Gemm

PS = 1e-12      # every kernel time below is counted in picoseconds
SPEC = DecoderSpec("tiny", layers=4, hidden=8, heads=2, kv_heads=1, ffn=16, ffn_kind="gelu", vocab=32, seq_len=4,
                   tied_embeddings=False)
COMPUTE = DeviceCompute(name="u", matmul={"bf16": MatmulTable(((1,), (1,), (1,)), {(1, 1, 1): 1.0}, "one rate"),
                                           "fp8": MatmulTable(((1,), (1,), (1,)), {(1, 1, 1): 2.0}, "one rate")},
                        attention={"k": AttentionRates(((1, 2.0),), ((1, 4.0),), "one rate")}, launch_floor_s=0.0,
                        memory_Bps=1e12, scale=1.0, path="u.toml")
HW = Hardware("hw", "", "cuda", "X", devices_per_node=2, memory_bytes=2**40,
              links=(Link("node", 1.0, 1e-6), Link("network", 0.5, 10e-6)))
# Elementwise bytes a token and layer: 10 h-wide (split by sp), 6 the rest (split by tp); every figure its own.
STACK = replace(stacks.MEGATRON_TE, name="s", attention_kernel="k", fused_projections=False,
                elementwise=lambda spec: (10.0, 6.0), elementwise_kernels=1, backward_factor=2.0, logit_bytes=4.0,
                selective="attention", optimizer_bytes=8.0, fsdp_gather_copy_bytes=1.0, fsdp_scatter_copy_bytes=2.0,
                tp_overlap_split=(("wq", "tp"), ("w2", "4")), refuses=())
TIMER = Timer(COMPUTE)


def node(kind_steps: int, factor: float, nbytes: float) -> float:
    """A collective on the node link: steps x 1 us + factor x bytes / 1 GB/s."""
    return kind_steps * 1e-6 + factor * nbytes / 1e9


def network(kind_steps: int, factor: float, nbytes: float) -> float:
    return kind_steps * 10e-6 + factor * nbytes / 0.5e9


def test_a_layer_at_tensor_parallel_2_kernel_by_kernel():
    # 8 tokens; a rank's GEMMs (m, n, k): wq (8, 4, 8), wk and wv (8, 2, 8), wo (8, 8, 4), w1 (8, 8, 8), w2 (8, 8, 8):
    # 2mnk = 512 + 256 + 256 + 512 + 1024 + 1024 = 3584 forward, twice that backward (dgrad and wgrad).
    # Causal attention: 4 x 8 tokens x 4 keys x 4 (q width 8 / tp) / 2 = 256 FLOPs, at 2 forward, x 2.5 at 4 back.
    # Elementwise: 8 x (10 + 6 / 2) = 104 B forward, x 2 backward.
    layer = kernels._layer(SPEC, Layout(tp=2), STACK, TIMER, HW, 8)
    tp_fwd = 2 * node(2, 1.0, 2 * 8 * 8)       # 2 all-reduces of 8 x 8 bf16 activations over 2 ranks, each way
    assert layer == pytest.approx({
        "fwd": (3584 + 128 + 104) * PS, "bwd": (7168 + 160 + 208) * PS, "tp_exposed": 2 * tp_fwd, "cp_exposed": 0.0,
        "tp_comm": 2 * tp_fwd, "gemm": (3584 + 7168) * PS, "attention": (128 + 160) * PS,
        "elementwise": (104 + 208) * PS, "recompute": 0.0}, rel=1e-12)
    # recomputed: the whole forward (and its all-reduces again), the attention alone, or torchtitan's odd GEMMs
    full = kernels._layer(SPEC, Layout(tp=2, recompute="full"), STACK, TIMER, HW, 8)
    assert (full["recompute"], full["bwd"], full["tp_comm"]) == pytest.approx(
        (3816 * PS, (7536 + 3816) * PS, 3 * tp_fwd), rel=1e-12)
    selective = kernels._layer(SPEC, Layout(tp=2, recompute="selective"), STACK, TIMER, HW, 8)
    assert selective["recompute"] == pytest.approx(128 * PS) and selective["tp_comm"] == pytest.approx(2 * tp_fwd)
    odd = kernels._layer(SPEC, Layout(tp=2, recompute="selective"), replace(STACK, selective="odd-mm"), TIMER, HW, 8)
    assert odd["recompute"] == pytest.approx((256 + 512 + 1024 + 104) * PS)    # wk, wo, w2 and the elementwise
    # sequence parallel: an all-gather and a reduce-scatter for each all-reduce, the h-wide bytes split too
    sp = kernels._layer(SPEC, Layout(tp=2, sp=True), STACK, TIMER, HW, 8)
    assert sp["elementwise"] == pytest.approx((8 * (10 / 2 + 6 / 2)) * 3 * PS)
    assert sp["tp_comm"] == pytest.approx(2 * 2 * (node(1, 0.5, 128) + node(1, 0.5, 128)))
    # one rank: no tensor-parallel communication at all, and the whole of each GEMM
    one = kernels.one_layer(SPEC, STACK, COMPUTE, HW, micro_batch=2)
    assert (one["tp_comm"], one["gemm"]) == (0.0, pytest.approx(3 * 2 * 8 * (64 + 32 + 32 + 64 + 128 + 128) * PS))


def test_overlapped_tensor_parallel_chunks_the_stack_s_gemms_and_shows_what_the_gemms_do_not_hide():
    # 10 tokens: wq in tp (2) chunks of 5 rows, w2 in 4 chunks of ceil(10 / 4) = 3 rows: 12 rows' work, not 10.
    plain = kernels._layer(SPEC, Layout(tp=2), STACK, TIMER, HW, 10)
    overlap = kernels._layer(SPEC, Layout(tp=2, tp_overlap=True), STACK, TIMER, HW, 10)
    w2 = 2 * 10 * 8 * 8
    assert overlap["gemm"] - plain["gemm"] == pytest.approx(w2 * 2 / 10 * PS, rel=1e-9)
    gemm_fwd = overlap["gemm"] - 2 * 4480 * PS          # the backward's GEMMs are not split by this stack
    tp_fwd = 2 * node(2, 1.0, 2 * 10 * 8)
    assert overlap["tp_exposed"] == pytest.approx((tp_fwd - gemm_fwd) + (tp_fwd - 2 * 4480 * PS), rel=1e-9)
    assert overlap["tp_comm"] == plain["tp_comm"] == pytest.approx(2 * tp_fwd)
    # on a device fast enough to hide it all, nothing is exposed
    slow = replace(COMPUTE, matmul={"bf16": MatmulTable(((1,), (1,), (1,)), {(1, 1, 1): 1e-6}, "")})
    assert kernels._layer(SPEC, Layout(tp=2, tp_overlap=True), STACK, Timer(slow), HW, 10)["tp_exposed"] == 0.0


def test_context_parallel_sends_kv_round_the_ring_behind_the_attention():
    # cp 2: K and V of 8 tokens (2 x 8 x 2 x kv width 4 / one KV head = 128 B) sent once forward, twice backward
    layer = kernels._layer(SPEC, Layout(cp=2), STACK, TIMER, HW, 8)
    ring = node(1, 1.0, 128)
    attn_fwd, attn_bwd = 4 * 8 * 4 * 8 / 2 / 2 * PS, 2.5 * 4 * 8 * 4 * 8 / 2 / 4 * PS
    assert layer["cp_exposed"] == pytest.approx((ring - attn_fwd) + (2 * ring - attn_bwd), rel=1e-12)
    assert layer["attention"] == pytest.approx(attn_fwd + attn_bwd)
    # three ranks: two steps round the ring; the K, V share of tp 2 halves where there are KV heads to split
    three = kernels._layer(replace(SPEC, heads=4, kv_heads=2, hidden=16), Layout(cp=3, tp=2), STACK, TIMER,
                           replace(HW, devices_per_node=8), 8)
    kv = 2 * 8 * 2 * 8 / 2
    attn = 4 * 8 * 4 * 8 / 2 / 2 * PS
    assert three["cp_exposed"] == pytest.approx(2 * node(1, 1.0, kv) - attn + 4 * node(1, 1.0, kv) - 2.5 * attn / 2,
                                                rel=1e-9)
    # a ring over two nodes of 2: every pass waits for its hop over the network
    four = kernels._layer(SPEC, Layout(cp=4), STACK, TIMER, HW, 8)
    hop = network(1, 1.0, 128)
    assert four["cp_exposed"] == pytest.approx(3 * hop - attn_fwd + 6 * hop - attn_bwd, rel=1e-12)


# torch's context parallelism with a figure of its own for each term: K and V repeated to every query head
TORCH_CP = replace(STACK, context_parallel=stacks.ContextParallel(
    kv_repeated=True, grad_bytes=4.0, merge_once=1.0, merge_step=2.0, send_copy=3.0, grad_once=5.0, grad_q_step=7.0,
    grad_kv_first=11.0, grad_kv_step=13.0, kernels_forward=17, kernels_backward=19, source="counted"))


def test_torch_context_parallel_gathers_kv_once_passes_its_gradients_on_and_merges_by_hand():
    # cp 2, 8 tokens: the output 8 x q width 8 = 64 elements; K and V repeated to the 2 query heads: 8 x 2 x 8 = 128
    layer = kernels._layer(SPEC, Layout(cp=2), TORCH_CP, TIMER, HW, 8)
    attn_fwd, attn_bwd = 256 * PS, 320 * PS                   # as the ring's: 4 x 8 x 4 x 8 / 2 at 2, x 2.5 at 4
    gather = node(1, 0.5, 2 * 128 * 2)                        # the bf16 K and V of both ranks gathered
    grad = node(1, 1.0, 4 * 128)                              # their float32 gradients passed on
    assert layer["cp_exposed"] == pytest.approx(
        (gather - attn_fwd / 2) + (gather - attn_bwd / 2) + (grad - attn_bwd / 2) + grad, rel=1e-12)
    # forward: 64 x (1 + 1 x 2) merged, 128 x 3 sent once; backward: (64 + 128) x 5 once, 2 steps x 64 x 7,
    # 128 x (11 + 13), 128 x 3 sent once; the stack's own elementwise 8 x 16, twice that backward
    assert layer["elementwise"] == pytest.approx((128 + 192 + 384 + 256 + 960 + 896 + 3072 + 384) * PS, rel=1e-12)
    assert layer["attention"] == pytest.approx(attn_fwd + attn_bwd)
    # kernels: 17 a later step forward, 19 each step backward, beside the stack's one
    floored = kernels._layer(SPEC, Layout(cp=2), TORCH_CP, Timer(replace(COMPUTE, launch_floor_s=1e-6)), HW, 8)
    assert floored["elementwise"] == pytest.approx((1 + 17) * 1e-6 + (1 + 2 * 19) * 1e-6)
    # K and V not repeated travel at the KV heads' width (4): half the bytes
    narrow = replace(TORCH_CP, context_parallel=replace(TORCH_CP.context_parallel, kv_repeated=False))
    assert kernels._layer(SPEC, Layout(cp=2), narrow, TIMER, HW, 8)["cp_exposed"] == pytest.approx(
        2 * node(1, 0.5, 2 * 64 * 2) - (attn_fwd + attn_bwd) / 2 + 2 * node(1, 1.0, 4 * 64) - attn_bwd / 2,
        rel=1e-12)
    # four ranks over two nodes: a gather over the network, three steps; without cp nothing at all
    four = kernels._layer(SPEC, Layout(cp=4), TORCH_CP, TIMER, HW, 8)
    assert four["cp_exposed"] == pytest.approx(
        2 * network(3, 0.75, 2 * 128 * 4) - (attn_fwd + attn_bwd) / 4 + 4 * network(1, 1.0, 4 * 128)
        - 3 * attn_bwd / 4, rel=1e-12)
    assert kernels._layer(SPEC, Layout(), TORCH_CP, TIMER, HW, 8)["cp_exposed"] == 0.0


def test_context_parallel_under_tensor_parallel_moves_a_rank_s_heads_only():
    # 4 query heads, 2 KV heads, tp 2 (one node of 8): a rank's output 8 x 16 / 2 = 64 elements and its repeated
    # K and V 8 x 2 x 16 / 2 = 128, as the tp 1 case above: the same bytes merged and sent
    spec, hw = replace(SPEC, heads=4, kv_heads=2, hidden=16), replace(HW, devices_per_node=8)
    layer = kernels._layer(spec, Layout(cp=2, tp=2), TORCH_CP, TIMER, hw, 8)
    alone = kernels._layer(spec, Layout(tp=2), TORCH_CP, TIMER, hw, 8)
    assert layer["elementwise"] - alone["elementwise"] == pytest.approx(
        (192 + 384 + 960 + 896 + 3072 + 384) * PS, rel=1e-12)
    # the ring (no description of its own) launches no kernel of its own: with a launch floor, the layer's
    # elementwise work is the one without cp
    floored = Timer(replace(COMPUTE, launch_floor_s=1e-6))
    assert kernels._layer(SPEC, Layout(cp=2), STACK, floored, HW, 8)["elementwise"] == pytest.approx(
        kernels._layer(SPEC, Layout(), STACK, floored, HW, 8)["elementwise"], rel=1e-12)


def test_context_parallel_ranks_hold_and_reduce_the_parameters_with_the_data_ranks():
    """A cp rank holds its peers' parameters: its gradients are summed over dp x fsdp x cp, and FSDP shards over
    fsdp x cp (cp alone too where the stack shards over it: torchtitan); a stack without FSDP reduces over the
    replicas and cp together (Megatron's data-parallel group with context parallelism)."""
    def data_side(layout: Layout, stack) -> tuple:
        s = kernels.decoder_stages(SPEC, layout, 8, HW, stack, COMPUTE)
        return (s.parts[0]["data_parallel_comm"], s.parts[0]["fsdp_copies"], s.after_comm[0],
                s.optimizer[0], s.memory["model_per_rank"][0],
                [(c.kind, c.nbytes, c.calls, c.ranks) for c in s.collectives[0]])

    def same(data_only: Layout, with_cp: Layout, stack) -> None:
        # 8 sequences of 4 tokens: 8 tokens a rank either way, so the state and the activations match too
        expected, got = data_side(data_only, stack), data_side(with_cp, stack)
        assert got[:5] == pytest.approx(expected[:5], rel=1e-12) and got[5] == expected[5], with_cp.name

    # (the ring's attention adds nothing to the layer's compute, so the windows the gathers hide behind match too)
    fsdp = replace(STACK, fsdp_over_cp=True)
    same(Layout(fsdp=4), Layout(fsdp=2, cp=2), fsdp)
    same(Layout(fsdp=2), Layout(cp=2), fsdp)
    same(Layout(dp=2, fsdp=4), Layout(dp=2, fsdp=2, cp=2), fsdp)
    same(Layout(fsdp=4), Layout(fsdp=2, cp=2), STACK)             # sharded already: cp joins the shards
    # without FSDP: the replicas' all-reduce (or ZeRO-1's reduce-scatter and gather) over dp x cp
    same(Layout(dp=4), Layout(dp=2, cp=2), STACK)
    same(Layout(dp=2), Layout(cp=2), STACK)
    same(Layout(dp=4, zero1=True), Layout(dp=2, cp=2, zero1=True), STACK)
    assert data_side(Layout(cp=2), STACK)[0] > 0
    # a Float8 stack's weights, FSDP-gathered over the cp ranks, arrive in fp8: gathered at 1 B, not cast on the rank
    f8 = replace(F8, fsdp_over_cp=True)
    same(Layout(fsdp=2), Layout(cp=2), f8)
    assert kernels._layer(SPEC, Layout(cp=2), f8, TIMER, HW, 8)["elementwise"] == pytest.approx(
        kernels._layer(SPEC, Layout(fsdp=2), f8, TIMER, HW, 8)["elementwise"], rel=1e-12)


def test_the_last_stage_s_head_and_the_stages_layers_by_hand():
    # 8 tokens: the output GEMM (8, 32 / tp, 8) and its two gradients; the loss over 8 x 32 / tp logits at 4 B;
    # the final norm 8 x 8 x 4 B forward, x 2 backward.
    assert kernels.head(SPEC, 1, STACK, TIMER, 8) == pytest.approx(
        {"gemm": 3 * 4096 * PS, "loss": 1024 * PS, "norm": 768 * PS})
    assert kernels.head(SPEC, 2, STACK, TIMER, 8) == pytest.approx(
        {"gemm": 3 * 2048 * PS, "loss": 512 * PS, "norm": 768 * PS})
    seven = replace(SPEC, layers=7)
    # 4 chunks of 2, 2, 2, 1 layers, stage 0 running chunks 0 and 2, stage 1 chunks 1 and 3
    assert kernels._stage_layers(seven, Layout(pp=2, virtual_stages=2, schedule="interleaved")) == [4, 3]
    assert kernels._stage_layers(seven, Layout(pp=3)) == [3, 2, 2]
    assert kernels._stage_layers(SPEC, Layout(pp=2)) == [2, 2]


def test_the_data_dimension_s_communication_by_hand():
    def dp(*args):   # the distributed optimizer gathers every parameter in bf16
        return kernels._data_parallel(*args, 2 * args[5])

    assert dp(SPEC, Layout(tp=2), HW, TIMER, STACK, 1e3, 100, 2 * 100, 4, 2, 1.0, 1.0) == (0.0, 0.0, 0.0, [])
    # DDP of 80M parameters: Megatron's buckets of 40M, so half the all-reduce shows whatever the backward hides
    reduce = node(2, 1.0, 4 * 80e6)
    exposed, total, copies, colls = dp(SPEC, Layout(dp=2), HW, TIMER, STACK, 80e6, 1e6, 2 * 1e6, 4, 1, 0.0, 0.1)
    assert (exposed, total, copies) == pytest.approx((reduce - 0.1, reduce, 0.0))
    assert colls == [Collective("all_reduce", "data", 4 * 80e6, 1, 2, True, "gradient all-reduce")]
    assert dp(SPEC, Layout(dp=2), HW, TIMER, STACK, 80e6, 1e6, 2 * 1e6, 4, 1, 0.0, 0.3)[0] == pytest.approx(reduce / 2)
    assert dp(SPEC, Layout(dp=2), HW, TIMER, STACK, 20e6, 1e6, 2 * 1e6, 4, 1, 0.0, 1.0)[0] == \
        pytest.approx(node(2, 1.0, 4 * 20e6))    # a model under one bucket: the whole all-reduce after the backward
    # 64 ranks: a bucket of 1M x 64 parameters of 100M; the data group crosses nodes
    big = dp(SPEC, Layout(dp=64), HW, TIMER, STACK, 100e6, 1e6, 2 * 1e6, 4, 1, 0.0, 10.0)[0]
    assert big == pytest.approx(0.64 * network(126, 2 * 63 / 64, 4e8), rel=1e-9)
    # ZeRO-1: a reduce-scatter of float32 gradients, an all-gather of bf16 weights
    scatter, gather = node(1, 0.5, 4 * 80e6), node(1, 0.5, 2 * 80e6)
    exposed, total, copies, colls = dp(SPEC, Layout(dp=2, zero1=True), HW, TIMER, STACK, 80e6, 1e6, 2 * 1e6, 4, 1,
                                       0.01, 0.02)
    assert (exposed, total, copies) == pytest.approx((scatter - 0.02 + gather - 0.01, scatter + gather, 0.0))
    assert colls == [Collective("reduce_scatter", "data", 4 * 80e6, 1, 2, True, "gradient reduce-scatter"),
                     Collective("all_gather", "data", 2 * 80e6, 1, 2, True, "weight all-gather")]
    assert dp(SPEC, Layout(dp=2, zero1=True), HW, TIMER, STACK, 80e6, 1e6, 2 * 1e6, 4, 1, 1.0, 1.0)[0] == \
        pytest.approx((scatter + gather) / 2)


def test_fsdp_gathers_each_layer_twice_and_hsdp_all_reduces_the_shards_across_nodes():
    def dp(*args):   # (FSDP gathers the layers: the distributed optimizer's gather is not asked)
        return kernels._data_parallel(*args, 0.0)

    # FSDP 2, 3 layers of 1000 parameters and 500 outside them, 2 micro-batches, windows of 1 and 2 us
    gather, scatter = node(1, 0.5, 2000), node(1, 0.5, 4000)
    root = node(1, 0.5, 1000) + node(1, 0.5, 2000)
    exposed, total, copies, colls = dp(SPEC, Layout(fsdp=2), HW, TIMER, STACK, 3500, 1000, 2 * 1000, 3, 2, 1e-6, 2e-6)
    fwd, bwd = 3 * gather, 3 * (gather + scatter)
    assert exposed == pytest.approx(2 * (gather + fwd - 1e-6 + bwd - 2e-6) + root, rel=1e-12)
    assert total == pytest.approx(2 * (fwd + bwd) + root, rel=1e-12)
    # each layer and micro-batch: 2 gathers' copy-out (1 B) and 1 copy-in (2 B); the 500 outside the layers once
    assert copies == pytest.approx((2 * 3 * 1000 * (2 * 1.0 + 2.0) + 500 * (1.0 + 2.0)) * PS, rel=1e-12)
    assert colls == [Collective("all_gather", "fsdp", 2000, 12, 2, True, "FSDP gathers"),
                     Collective("reduce_scatter", "fsdp", 4000, 6, 2, True, "FSDP scatters")]
    # windows longer than the communication hide all but the first gather of each micro-batch
    assert dp(SPEC, Layout(fsdp=2), HW, TIMER, STACK, 3500, 1000, 2 * 1000, 3, 2, 1.0, 1.0)[0] == \
        pytest.approx(2 * gather + root, rel=1e-12)
    # under a pipeline torchtitan keeps the layers gathered: one gather a layer and micro-batch
    assert dp(SPEC, Layout(fsdp=2), HW, TIMER, stacks.TORCH_EAGER, 3500, 1000, 2 * 1000, 3, 2, 1.0,
              1.0)[3][0].calls == 12
    kept = dp(SPEC, Layout(fsdp=2, pp=2), HW, TIMER, stacks.TORCH_EAGER, 3500, 1000, 2 * 1000, 3, 2, 1.0, 1.0)
    # and torch's pipelining through the step: each layer gathered once (the first micro-batch) and reduced once,
    # after the last micro-batch's backward, with nothing left to hide the reduce-scatters behind
    assert [c.calls for c in kept[3]] == [3, 3] and kept[1] == pytest.approx(3 * (gather + scatter) + root, rel=1e-12)
    assert kept[0] == pytest.approx(gather + 3 * scatter + root, rel=1e-12)
    short = dp(SPEC, Layout(fsdp=2, pp=2), HW, TIMER, stacks.TORCH_EAGER, 3500, 1000, 2 * 1000, 3, 2, 1e-6, 1.0)
    assert short[0] == pytest.approx(gather + 3 * gather - 1e-6 + 3 * scatter + root, rel=1e-12)
    # ZeRO-2 keeps them gathered whatever the stack, without a pipeline too: one gather, one copy-out fewer
    zero2 = dp(SPEC, Layout(fsdp=2, zero2=True), HW, TIMER, STACK, 3500, 1000, 2 * 1000, 3, 2, 1e-6, 2e-6)
    assert zero2[0] == pytest.approx(2 * (gather + fwd - 1e-6 + 3 * scatter - 2e-6) + root, rel=1e-12)
    assert zero2[2] == pytest.approx((2 * 3 * 1000 * (1.0 + 2.0) + 500 * (1.0 + 2.0)) * PS, rel=1e-12)
    assert [c.calls for c in zero2[3]] == [6, 6]
    assert kept[2] == pytest.approx((3 * 1000 * (4.0 + 6.0) + 500 * (4.0 + 6.0)) * PS, rel=1e-12)
    # HSDP 2 x 2 on nodes of 2: the shards' replicas all-reduce over the network, the layers' and the rest's
    replicas, root_replicas = network(2, 1.0, 4000 / 2), network(2, 1.0, 2000 / 2)
    hsdp = dp(SPEC, Layout(dp=2, fsdp=2), HW, TIMER, STACK, 3500, 1000, 2 * 1000, 3, 2, 1.0, 1.0)
    assert hsdp[1] == pytest.approx(2 * 3 * (2 * gather + scatter + replicas) + root + root_replicas, rel=1e-12)


def test_a_pipeline_of_two_stages_assembled_term_by_term():
    # dp 2 x pp 2, 2 micro-batches of 1 sequence (4 tokens): 2 layers a stage; the stages 2 ranks apart cross nodes
    layout = Layout(dp=2, pp=2, micro_batches=2)
    out = kernels.decoder_stages(SPEC, layout, 4, HW, STACK, COMPUTE)
    layer = kernels._layer(SPEC, layout, STACK, TIMER, HW, 4)
    head = kernels.head(SPEC, 1, STACK, TIMER, 4)
    embed = 4 * 8 * 2 * 4 * PS                       # the look-up and its gradient: 4 B a value, 2 B each
    send = network(1, 1.0, 2 * 4 * 8)               # one micro-batch's activations to the next stage
    layer_params, first, last = 464, 2 * 464 + 256, 2 * 464 + 8 + 256
    assert (out.micro_batches, out.seq_len) == (2, 4)
    assert out.compute == pytest.approx([2 * (layer["fwd"] + layer["bwd"]) + embed,
                                         2 * (layer["fwd"] + layer["bwd"]) + sum(head.values())], rel=1e-12)
    assert out.inside == pytest.approx([2 * send, 2 * send], rel=1e-12)
    assert out.recompute == [0.0, 0.0] and out.after_other == [0.0, 0.0]
    reduce = [node(2, 1.0, 4 * first), node(2, 1.0, 4 * last)]       # under one bucket: after the backward
    assert out.after_comm == pytest.approx(reduce, rel=1e-12)
    assert out.optimizer == pytest.approx([8 * first * PS, 8 * last * PS], rel=1e-12)
    sends = Collective("send_recv", "pp", 64, 4, 2, True, "pipeline activations and gradients")
    assert out.collectives == [[sends, Collective("all_reduce", "data", 4 * first, 1, 2, True, "gradient all-reduce")],
                               [sends, Collective("all_reduce", "data", 4 * last, 1, 2, True, "gradient all-reduce")]]
    assert out.parts[1] == pytest.approx({"fsdp_copies": 0.0, "data_parallel_comm": reduce[1],
                                          "gemm": 2 * 2 * layer["gemm"], "attention": 2 * 2 * layer["attention"],
                                          "elementwise": 2 * 2 * layer["elementwise"]}, rel=1e-12)
    assert out.memory["model_per_rank"] == [
        decoder_rank_bytes(SPEC, layout, 4, first, layer_params, 2, 2, False, "attention", 0, 2),
        decoder_rank_bytes(SPEC, layout, 4, last, layer_params, 2, 2, True, "attention", 1, 2)]
    # interleaved: the sends overlap the other chunks' work, twice as many of them; the vocabulary split over tp
    chunked = kernels.decoder_stages(SPEC, Layout(tp=2, pp=2, micro_batches=2, schedule="interleaved",
                                                  virtual_stages=2, vocab_split=True, sp=True), 2, HW, STACK,
                                     COMPUTE)
    assert chunked.collectives[0][0] == Collective("send_recv", "pp", 2 * 4 * 8 / 2, 8, 2, False,
                                                   "pipeline activations and gradients")
    assert chunked.inside == pytest.approx([2 * chunked_tp(), 2 * chunked_tp()], rel=1e-12)
    assert chunked.compute[1] - chunked.compute[0] == pytest.approx(
        sum(kernels.head(SPEC, 2, STACK, TIMER, 4).values()) - 4 * 8 * 2 * 4 / 2 * PS, rel=1e-9)


def test_each_stage_of_a_long_pipeline_reduces_its_own_parameters():
    """6 layers on 4 stages: 2, 2, 1 and 1 a stage, the first with the embedding, the last with the head, so that
    the first stage and the second, and the second and the third, hold different parameters though alike in one
    way each (decoder_stages works a stage's data-parallel terms out once for stages alike in all three); and 4
    layers, one a stage, where the first stage and the third differ by the embedding alone."""
    embedding, head = 32 * 8, 8 + 32 * 8                  # the vocabulary's rows; the final norm and output layer
    for layers, held in ((6, [2 * 464 + embedding, 2 * 464, 464, 464 + head]),
                         (4, [464 + embedding, 464, 464, 464 + head])):
        out = kernels.decoder_stages(replace(SPEC, layers=layers), Layout(dp=2, pp=4, micro_batches=4), 8, HW, STACK,
                                     COMPUTE)
        assert [c.nbytes for stage in out.collectives for c in stage if c.kind == "all_reduce"] == [4 * p for p in held]
        assert out.optimizer == pytest.approx([8 * p * PS for p in held], rel=1e-12)


def chunked_tp() -> float:
    """A layer's tensor-parallel communication with sp at 4 tokens, none of it overlapped."""
    return 2 * 2 * (node(1, 0.5, 64) + node(1, 0.5, 64))


def test_a_rank_s_memory_worked_by_hand():
    """decoder_rank_bytes for SPEC, 8 tokens, a stage of 1,000 parameters unsharded: bf16 parameters and float32
    gradients, master weights and moments, 18 B each (18,000 B). A layer keeps, per token, its norms', QKV's and
    FFN's inputs (2 + 1 + 1 values of h = 8, split by sp) and Q, K, V (8 + 4 + 4), the context (8), GELU's input and
    fc2's (16 + 16), all bf16, split by tp, and the log-sum-exp (2 heads, float32): 64 / sp + 120 / tp B. The last
    stage adds its logits: bf16, their float32 copy and its gradient, 10 B each of 32 / tp (vocabulary split)."""
    def rank(layout, layers=4, tokens=8, last=False, stage=0, micro_batches=1):
        return decoder_rank_bytes(SPEC, layout, tokens, 1000, 100, layers, micro_batches, last, "attention", stage, 0)

    tp2 = Layout(tp=2, sp=True)
    assert rank(tp2) == 18000 + 4 * 8 * (32 + 60)
    assert rank(replace(tp2, vocab_split=True), last=True) == 18000 + 4 * 8 * (32 + 60) + 8 * 32 / 2 * 10
    assert rank(tp2, last=True) == 18000 + 4 * 8 * (32 + 60) + 8 * 32 * 10     # every rank the whole vocabulary
    # a loss that holds only the bf16 logits and their bf16 gradient (OLMo-core's compiled loss): 4 B a logit
    assert decoder_rank_bytes(SPEC, tp2, 8, 1000, 100, 4, 1, True, "attention", 0, 0, logit_bytes=4) == \
        18000 + 4 * 8 * (32 + 60) + 8 * 32 * 4
    # full recomputation: each layer's input (16 B a token), and the one layer being recomputed
    assert rank(Layout(recompute="full")) == 18000 + 4 * 8 * 16 + 8 * 184
    # 1F1B on 2 stages of 2 layers, 4 micro-batches of 4 tokens: stage 0 holds 2 of them, stage 1 one
    pipeline = Layout(pp=2, micro_batches=4, schedule="1f1b")
    assert [rank(pipeline, 2, 4, stage=s, micro_batches=4) for s in (0, 1)] == [18000 + 2 * 2 * 4 * 184,
                                                                                 18000 + 2 * 4 * 184]


def test_fsdp_stages_update_their_shard_and_torchtitan_holds_the_stage_gathered():
    layout = Layout(fsdp=2, pp=2, micro_batches=2)
    eager = replace(stacks.TORCH_EAGER, attention_kernel="k", refuses=())
    out = kernels.decoder_stages(SPEC, layout, 4, HW, eager, COMPUTE)
    first = 2 * 464 + 256
    assert out.optimizer[0] == pytest.approx(first / 2 * 92.0 * PS, rel=1e-12)      # its half of the stage
    # the stage's 2 layers held gathered, their float32 gradients accumulated unsharded through the step
    assert out.memory["model_per_rank"][0] == decoder_rank_bytes(SPEC, layout, 4, first, 464, 2, 2, False, "odd-mm",
                                                                 0, 2, 2)
    assert decoder_rank_bytes(SPEC, layout, 4, first, 464, 2, 2, False, "odd-mm", 0, 2, 2) - \
        decoder_rank_bytes(SPEC, layout, 4, first, 464, 2, 2, False, "odd-mm", 0, 2) == 2 * 464 * 4
    # the last stage's logits at the stack's bytes a logit: a micro-batch of one 4-token sequence x the vocabulary
    lean = kernels.decoder_stages(SPEC, layout, 4, HW, replace(eager, logit_live_bytes=4.0), COMPUTE)
    assert out.memory["model_per_rank"][1] - lean.memory["model_per_rank"][1] == pytest.approx(4 * SPEC.vocab * 6)
    assert out.memory["model_per_rank"][0] == lean.memory["model_per_rank"][0]
    three = replace(SPEC, layers=6)          # 3 layers a stage: all 3 held gathered, or 2 at a time resharded
    held = kernels.decoder_stages(three, layout, 4, HW, eager, COMPUTE)
    assert held.memory["model_per_rank"][0] == decoder_rank_bytes(three, layout, 4, 3 * 464 + 256, 464, 3, 2, False,
                                                                  "odd-mm", 0, 3, 3)
    resharded = kernels.decoder_stages(three, layout, 4, HW, replace(eager, fsdp_reshard_under_pp=True), COMPUTE)
    assert resharded.memory["model_per_rank"][0] == decoder_rank_bytes(three, layout, 4, 3 * 464 + 256, 464, 3, 2,
                                                                       False, "odd-mm", 0, 2)
    # the data dimension's windows are the stage's layers' forward and backward; its copies the FSDP copies
    layer = kernels._layer(three, layout, eager, TIMER, HW, 4)
    comm = kernels._data_parallel(three, layout, HW, TIMER, eager, 3 * 464 + 256, 464, 2 * 464, 3, 2,
                                  3 * layer["fwd"], 3 * layer["bwd"], 0.0)
    assert (held.after_comm[0], held.after_other[0]) == pytest.approx(comm[0:3:2], rel=1e-12) and comm[2] > 0
    assert held.parts[0]["data_parallel_comm"] == pytest.approx(comm[1], rel=1e-12)
    zero1 = kernels.decoder_stages(SPEC, Layout(dp=2, zero1=True), 2, HW, STACK, COMPUTE)
    assert zero1.optimizer == pytest.approx([(4 * 464 + 256 + 264) / 2 * 8 * PS], rel=1e-12)


def test_what_a_decoder_s_step_is_timed_by_and_each_refusal_in_one_line():
    basis = Basis(0.0, 0.0, 2e-9, 0.0, None, None, None, None, "compute ASSUMED", flops_per_s=1e12)
    assumed = Timer(basis)
    assert assumed.gemm(Gemm("g", 2, 3, 4)) == pytest.approx(48e-12)
    assert assumed.attention("any", 1e12, 4, True) == 1.0 and assumed.memory(1e9, 3) == 0.0
    assert assumed.optimizer(1000, STACK) == pytest.approx(2e-6)
    assert TIMER.optimizer(1000, STACK) == pytest.approx(8000 * PS)
    assert kernels.compute_label(basis) == "compute ASSUMED"
    assert kernels.compute_label(COMPUTE) == ("compute from first principles: u.toml (measured and published "
                                              "kernel rates, each with its source)")
    assert kernels._cost(HW, Layout(dp=4), "dp", 1, "all_reduce", 1e9) == 0.0
    assert kernels._cost(HW, Layout(dp=4), "dp", 4, "all_reduce", 1e9) == pytest.approx(network(6, 1.5, 1e9))
    assert kernels._cost(HW, Layout(dp=4), "dp", 2, "all_reduce", 1e9) == pytest.approx(node(2, 1.0, 1e9))
    with pytest.raises(ValueError, match="^tiny: a decoder's step needs the software stack that runs it "
                                         r"\(--stack\)$"):
        kernels.decoder_stages(SPEC, Layout(dp=2), 2, HW, None, COMPUTE)
    with pytest.raises(ValueError, match="^tiny: a decoder is timed from a device's compute table or an assumed "
                                         "MFU; no decoder is executed here, so no measured 1-device run times one$"):
        kernels.decoder_stages(SPEC, Layout(dp=2), 2, HW, STACK, replace(basis, flops_per_s=None))
    with pytest.raises(ValueError) as bad:
        kernels.decoder_stages(SPEC, Layout(dp=3), 2, HW, STACK, COMPUTE)
    assert type(bad.value) is ValueError and "\n" not in str(bad.value)
    with pytest.raises(ValueError, match="cannot overlap tensor-parallel communication"):
        kernels.decoder_stages(SPEC, Layout(tp=2, tp_overlap=True), 1, HW, replace(STACK, tp_overlap_split=()),
                               COMPUTE)


# Float8 with every byte count its own figure: a cast 3 B, an amax 5, a column-major copy 7, an fp8 gather 1 B, the
# precomputed scales' read 11; 4 cast kernels a forward.
F8 = replace(STACK, name="f8", float8=stacks.Float8(cast_bytes=3.0, amax_bytes=5.0, transpose_bytes=7.0,
                                                     gather_bytes=1.0, scale_bytes=11.0, kernels_forward=4,
                                                     source="s"))


def test_a_float8_layer_runs_its_linears_at_the_fp8_rate_and_counts_its_casts_by_hand():
    # SPEC (h 8, q 8, kv 4, GELU f 16): 448 Linear weight elements (wq 64, wk 32, wv 32, wo 64, w1 128, w2 128).
    # One device, 8 tokens. Inputs cast once each: the attention's and FFN's (8 each), wo's (8), w2's (16): 40 a
    # token; output gradients: wq 8 + wk 4 + wv 4 + w1 16 + wo 8 + w2 8 = 48 a token. Forward: 8 x 3 x 40 = 960,
    # and the weights held whole cast on the device, (5 + 3) x 448 = 3584. Backward: 8 x (7 x 40 + 3 x 48 +
    # 7 x 48) = 6080, and the weights copied for the input gradient, 7 x 448 = 3136.
    f8 = stacks.Float8(3.0, 5.0, 7.0, 1.0, 11.0, 4, "s")
    assert kernels._float8_casts(SPEC, Layout(), f8, 8) == (4544.0, 9216.0, 4 + 3 * 6)
    # SwiGLU: w3 too (576 weights; its f-wide output gradient, the gate's input shared with w1)
    assert kernels._float8_casts(replace(SPEC, ffn_kind="swiglu"), Layout(), f8, 8) == (
        960.0 + 8 * 576, 8 * (7 * 40 + 3 * 64 + 7 * 64) + 7 * 576, 4 + 3 * 7)
    # tp 2 with sp under FSDP: the h-wide inputs and row-parallel output gradients cast before their gathers
    # (h / 2), copied gathered (h); the weights gathered in fp8 (no cast on the rank), 224 a rank copied.
    assert kernels._float8_casts(SPEC, Layout(tp=2, sp=True, fsdp=2), f8, 8) == (
        8 * 3 * (8 + 12), 8 * (7 * (16 + 12) + 3 * (16 + 8) + 7 * (16 + 16)) + 7 * 224, 22)
    # tp 2 without sp: the h-wide tensors whole on every rank, cast there; 224 weights a rank cast on it
    assert kernels._float8_casts(SPEC, Layout(tp=2), f8, 8) == (
        8 * 3 * (16 + 12) + 8 * 224, 8 * (7 * (16 + 12) + 3 * (16 + 16) + 7 * (16 + 16)) + 7 * 224, 22)
    bf16 = kernels._layer(SPEC, Layout(), STACK, TIMER, HW, 8)
    fp8 = kernels._layer(SPEC, Layout(), F8, TIMER, HW, 8)
    # a stack without Float8 casts nothing: 8 x 16 B forward, twice that backward (picoseconds: abs=0)
    assert bf16["elementwise"] == pytest.approx(3 * 128 * PS, rel=1e-12, abs=0)
    # the fp8 table's rate is twice bf16's: forward GEMMs 7168 FLOPs at 1 or at 2, backward twice that
    assert fp8["gemm"] == pytest.approx(bf16["gemm"] / 2, rel=1e-12)
    assert fp8["elementwise"] - bf16["elementwise"] == pytest.approx((4544 + 9216) * PS, rel=1e-12)
    assert fp8["fwd"] - bf16["fwd"] == pytest.approx((4544 - 3584) * PS, rel=1e-12)
    assert fp8["bwd"] - bf16["bwd"] == pytest.approx((9216 - 7168) * PS, rel=1e-12)
    full = kernels._layer(SPEC, Layout(recompute="full"), F8, TIMER, HW, 8)
    assert full["recompute"] == pytest.approx(fp8["fwd"], rel=1e-12)          # the casts recomputed with it
    # tensor parallel 2 with sp: the gathers in fp8 (8 tokens x 8 x 1 B), the reduce-scatters in bf16 (x 2 B)
    tp = kernels._layer(SPEC, Layout(tp=2, sp=True), F8, TIMER, HW, 8)
    assert tp["tp_comm"] == pytest.approx(2 * 2 * (node(1, 0.5, 64) + node(1, 0.5, 128)), rel=1e-12)
    assert kernels._layer(SPEC, Layout(tp=2, sp=True), STACK, TIMER, HW, 8)["tp_comm"] == pytest.approx(
        2 * 2 * 2 * node(1, 0.5, 128), rel=1e-12)
    # the output layer stays in bf16
    assert kernels.head(SPEC, 1, F8, TIMER, 8) == kernels.head(SPEC, 1, STACK, TIMER, 8)
    # each cast a kernel: 1 + 4 forward, 1 + 22 backward, each at least the launch floor
    floored = kernels._layer(SPEC, Layout(), F8, Timer(replace(COMPUTE, launch_floor_s=1e-6)), HW, 8)
    assert floored["elementwise"] == pytest.approx(28e-6, rel=1e-12)


def test_fsdp_gathers_a_float8_stack_s_linear_weights_in_fp8_and_reads_them_for_their_scales():
    layout = Layout(fsdp=2)
    f8, bf16 = (kernels.decoder_stages(SPEC, layout, 2, HW, s, COMPUTE) for s in (F8, STACK))
    # a layer: 448 Linear weights at 1 B and the two norms' 16 at 2 B, instead of 464 x 2
    assert [c.nbytes for c in f8.collectives[0] if c.kind == "all_gather"] == [480.0]
    assert [c.nbytes for c in bf16.collectives[0] if c.kind == "all_gather"] == [928.0]
    # the copy-out reads and writes what was gathered (2 gathers a layer, 4 layers, 1 B a bf16 element here);
    # after the optimizer every weight's shard read once for its amax: 4 x 448 / 2 x 11 B
    assert f8.after_other[0] - bf16.after_other[0] == pytest.approx((4 * 2 * (480 - 928) / 2 + 4 * 224 * 11) * PS,
                                                                    rel=1e-12)
    # the amaxes all-reduced (4 layers x 6 Linears, float32) once a step, exposed beside the gathers
    layer = kernels._layer(SPEC, layout, F8, TIMER, HW, 4)
    root = 256 + 264                     # the embedding; the final norm and output layer
    gathers = kernels._data_parallel(SPEC, layout, HW, TIMER, F8, 4 * 464 + root, 464, 480, 4, 1,
                                     4 * layer["fwd"], 4 * layer["bwd"], 0.0)[0]
    assert f8.after_comm[0] == pytest.approx(gathers + node(2, 1.0, 4 * 4 * 6), rel=1e-12)
    # the precomputed scales' read is one kernel: at a 1 us launch floor, 1 us
    floored = [kernels.decoder_stages(SPEC, layout, 2, HW, s, replace(COMPUTE, launch_floor_s=1e-6))
               for s in (F8, replace(F8, float8=replace(F8.float8, scale_bytes=0.0)))]
    assert floored[0].after_other[0] - floored[1].after_other[0] == pytest.approx(1e-6, rel=1e-9)
    # under tp 2 a rank gathers its half: 224 Linear weights at 1 B and 8 of the norms at 2 B
    tp = kernels.decoder_stages(SPEC, Layout(fsdp=2, tp=2, sp=True), 2, HW, F8, COMPUTE)
    assert [c.nbytes for c in tp.collectives[0] if c.kind == "all_gather" and c.dim == "fsdp"] == [240.0]
    # without FSDP nothing is gathered: the weights are cast on the rank and no scale is precomputed
    dp = kernels.decoder_stages(SPEC, Layout(dp=2), 2, HW, F8, COMPUTE)
    assert dp.after_other == [0.0]
    with pytest.raises(ValueError, match=r"^f8: an assumed MFU is a fraction of one peak, and Float8 runs its GEMMs "
                                         r"at two \(fp8 and bf16\): predict it from a compute table$"):
        kernels.decoder_stages(SPEC, Layout(), 1, HW, F8, Basis(0.0, 0.0, 2e-9, 0.0, None, None, None, None, "A",
                                                                flops_per_s=1e12))


# Transformer Engine's current scaling with F8's figures: casts write the column-major copies, the attention
# output's and output gradients' amaxes read apart, the weights kept in fp8.
TE8 = replace(F8, name="te8", float8=replace(F8.float8, transpose_in_cast=True, amax_unfused=True,
                                             weights_in_fp8=True))


def test_transformer_engine_s_current_scaling_casts_with_their_copies_and_reads_their_own_amaxes_by_hand():
    # One device, 8 tokens (inputs 40 a token, output gradients 48, as above): each cast writes its column-major
    # copy (1 B); the attention output's amax (8 a token) and each output gradient's (48) read apart at 5 B; the
    # weights kept in fp8, neither cast nor copied here. Kernels: 4 forward casts; backward, each Linear's output
    # gradient cast and its amax (2 x 6).
    f8 = TE8.float8
    assert kernels._float8_casts(SPEC, Layout(), f8, 8) == (8 * (3 * 40 + 5 * 8), 8 * (3 * 48 + 5 * 48 + 40 + 48),
                                                            4 + 12)
    # tp 2 with sp: inputs 20 a token (8 of them h-wide, cast before their gather), output gradients 24 (8
    # h-wide); the h-wide ones copied column-major after their gathers at 7 B (4 x 8 gathered, 4 copy kernels),
    # the rest copied by their casts
    assert kernels._float8_casts(SPEC, Layout(tp=2, sp=True), f8, 8) == (
        8 * (3 * 20 + 5 * 4), 8 * (3 * 24 + 5 * 24 + (20 + 24 - 16) + 7 * 32), 4 + 4 + 12)
    # tp 2 without sp: the h-wide tensors whole on every rank (inputs 16 + 12, output gradients 16 + 16), nothing
    # gathered, every copy written by its cast
    assert kernels._float8_casts(SPEC, Layout(tp=2), f8, 8) == (
        8 * (3 * 28 + 5 * 4), 8 * (3 * 32 + 5 * 32 + 28 + 32), 16)


def test_weights_kept_in_fp8_are_gathered_in_fp8_by_the_distributed_optimizer_and_cast_once_a_step():
    """ZeRO-1 over 2: the stage's 4 x 448 Linear weights gathered at 1 B, the rest (4 x 16 norms, the embedding
    256 and the head 264) at 2 B; after the optimizer each weight shard cast from its master (11 B an element of
    the 896-element shard, one kernel) and the 24 amaxes all-reduced over the data ranks; each weight copied
    column-major once a step (7 B, one kernel a Linear); gradients reduced at the stack's bytes."""
    layout = Layout(dp=2, zero1=True)
    te, plain = (kernels.decoder_stages(SPEC, layout, 2, HW, s, COMPUTE) for s in (TE8, STACK))
    gathers = {s: [c.nbytes for c in x.collectives[0] if c.kind == "all_gather"] for s, x in (("te", te),
                                                                                            ("plain", plain))}
    assert gathers == {"te": [4 * 448 + 2 * (4 * 16 + 256 + 264)], "plain": [2 * (4 * 464 + 256 + 264)]}
    assert te.after_other[0] == pytest.approx((4 * 448 / 2 * 11 + 4 * 448 * 7) * PS, rel=1e-12)
    floored = kernels.decoder_stages(SPEC, layout, 2, HW, TE8, FLOOR)
    assert floored.after_other[0] == pytest.approx(1e-6 + 6e-6, rel=1e-12)
    amaxes = node(2, 1.0, 4 * 4 * 6)
    assert te.after_comm[0] - plain.after_comm[0] == pytest.approx(
        amaxes - (node(1, 0.5, 2 * (4 * 464 + 520)) - node(1, 0.5, 4 * 448 + 2 * (64 + 520))), rel=1e-9)
    # the gradients at 2 B: the reduce-scatter's bytes halve, and plain data parallelism's all-reduce's
    half = replace(STACK, grad_reduce_bytes=2.0)
    scatters = [c.nbytes for c in kernels.decoder_stages(SPEC, layout, 2, HW, half, COMPUTE).collectives[0]
                if c.kind == "reduce_scatter"]
    assert scatters == [2 * (4 * 464 + 520)]
    # with no window to hide behind, the reduce-scatter of bf16 gradients costs what the bf16 weights' gather does;
    # the replicas' all-reduce of them 2 steps of the 2 x 2376 B; FSDP's reduce-scatters (4 layers and the root's
    # 520) at half their float32 cost
    dp = kernels._data_parallel
    assert dp(SPEC, layout, HW, TIMER, half, 2376, 464, 928, 4, 1, 0.0, 0.0, 2 * 2376)[0] == \
        pytest.approx(2 * node(1, 0.5, 2 * 2376), rel=1e-12)
    assert dp(SPEC, Layout(dp=2), HW, TIMER, half, 2376, 464, 928, 4, 1, 0.0, 0.0, 0.0)[0] == \
        pytest.approx(node(2, 1.0, 2 * 2376), rel=1e-12)
    fsdp_total = [dp(SPEC, Layout(fsdp=2), HW, TIMER, s, 2376, 464, 928, 4, 1, 0.0, 0.0, 0.0)[1] for s in (STACK, half)]
    assert fsdp_total[0] - fsdp_total[1] == pytest.approx(
        4 * (node(1, 0.5, 4 * 464) - node(1, 0.5, 2 * 464)) + node(1, 0.5, 4 * 520) - node(1, 0.5, 2 * 520), rel=1e-9)
    assert [c.nbytes for c in kernels.decoder_stages(SPEC, Layout(dp=2), 2, HW, half, COMPUTE).collectives[0]] == \
        [2 * (4 * 464 + 520)]
    assert [c.nbytes for c in kernels.decoder_stages(SPEC, Layout(fsdp=2), 2, HW, half, COMPUTE).collectives[0]
            if c.kind == "reduce_scatter"] == [2 * 464]
    # under tp 2 a rank's half: 224 Linear weights a layer, cast from 112-element shards and copied
    tp = kernels.decoder_stages(SPEC, Layout(dp=2, tp=2, sp=True, zero1=True), 4, HW, TE8, COMPUTE)
    assert tp.after_other[0] == pytest.approx((4 * 224 / 2 * 11 + 4 * 224 * 7) * PS, rel=1e-12)
    # kept in fp8 without the distributed optimizer: each replica casts all 1792 from its master, reduces nothing
    replicas = kernels.decoder_stages(SPEC, Layout(dp=2), 2, HW, TE8, COMPUTE)
    assert replicas.after_other[0] == pytest.approx((4 * 448 * 11 + 4 * 448 * 7) * PS, rel=1e-12)
    assert [c.kind for c in replicas.collectives[0]] == ["all_reduce"]
    # the gradient buffer at the stack's bytes: 2 B an element of the stage's 2376 parameters fewer; FSDP's
    # sharded float32 gradients whatever the stack reduces in
    assert kernels.decoder_stages(SPEC, layout, 2, HW, half, COMPUTE).memory["model_per_rank"][0] == \
        plain.memory["model_per_rank"][0] - 2 * 2376
    assert kernels.decoder_stages(SPEC, Layout(fsdp=2), 2, HW, half, COMPUTE).memory["model_per_rank"] == \
        kernels.decoder_stages(SPEC, Layout(fsdp=2), 2, HW, STACK, COMPUTE).memory["model_per_rank"]
    # Float8 weights not kept in fp8: the distributed optimizer gathers bf16, casts nothing after the optimizer
    torchao = kernels.decoder_stages(SPEC, layout, 2, HW, F8, COMPUTE)
    assert [c.nbytes for c in torchao.collectives[0] if c.kind == "all_gather"] == gathers["plain"]
    assert torchao.after_other == [0.0]


FLOOR = replace(COMPUTE, launch_floor_s=1e-6)     # every kernel at least 1 us: the kernel counts show


def test_each_memory_bound_kernel_takes_at_least_the_launch_floor():
    timer = Timer(FLOOR)
    assert timer.memory(1.0) == 1e-6 and timer.memory(1.0, 3) == 3e-6 and timer.memory(0.0, 3) == 0.0
    assert timer.optimizer(10, STACK) == 8e-6              # AdamW and clipping: 8 kernels
    assert kernels.head(SPEC, 1, STACK, timer, 8) == pytest.approx({"gemm": 3e-6, "loss": 4e-6, "norm": 2e-6})
    layer = kernels._layer(SPEC, Layout(), replace(STACK, elementwise_kernels=3), timer, HW, 8)
    assert layer["elementwise"] == pytest.approx(6e-6) and layer["gemm"] == pytest.approx(18e-6)
    # FSDP's copies: 2 kernels a layer and a third where it gathers again for the backward, 2 for the root's
    assert kernels._data_parallel(SPEC, Layout(fsdp=2), HW, timer, STACK, 3500, 1000, 2000, 3, 2, 1.0,
                                  1.0, 0.0)[2] == 11e-6
    assert kernels._data_parallel(SPEC, Layout(fsdp=2, pp=2), HW, timer, stacks.TORCH_EAGER, 3500, 1000, 2000, 3,
                                  2, 1.0, 1.0, 0.0)[2] == 8e-6
    assert kernels._data_parallel(SPEC, Layout(fsdp=2), HW, timer, STACK, 3000, 1000, 2000, 3, 2, 1.0,
                                  1.0, 0.0)[2] == 9e-6
    # the embedding: its look-up and its gradient, 2 kernels; fused projections: fewer, larger GEMMs
    out = kernels.decoder_stages(SPEC, Layout(), 1, HW, STACK, FLOOR)
    body = 4 * (layer["fwd"] + layer["bwd"] - 6e-6 + 2e-6)
    assert out.compute == pytest.approx([body + 2e-6 + 9e-6], rel=1e-12)
    fused = kernels._layer(SPEC, Layout(), replace(STACK, fused_projections=True), timer, HW, 8)
    assert fused["gemm"] == pytest.approx(12e-6)
    # odd-mm recomputes the 2nd, 4th... GEMM: of the fused four, wo and w2
    odd = kernels._layer(SPEC, Layout(recompute="selective"), replace(STACK, fused_projections=True,
                                                                       selective="odd-mm"), Timer(COMPUTE), HW, 8)
    assert odd["recompute"] == pytest.approx((2 * 8 * 8 * 8 + 2 * 8 * 8 * 16 + 8 * 16) * PS)


def test_the_precision_the_attention_s_sequence_and_the_link_each_kind_was_probed_at():
    assert Timer(COMPUTE, "fp8").gemm(Gemm("g", 2, 3, 4)) == pytest.approx(24 * PS)
    fp8 = kernels.one_layer(SPEC, STACK, COMPUTE, HW, micro_batch=2, precision="fp8", recompute="full")
    bf16 = kernels.one_layer(SPEC, STACK, COMPUTE, HW, micro_batch=2)
    assert fp8["gemm"] == pytest.approx(bf16["gemm"] / 2) and fp8["recompute"] == pytest.approx(fp8["fwd"])
    # a context-parallel rank's attention runs at the rate of its share of the sequence: 2 of 4 tokens
    by_seq = replace(COMPUTE, attention={"k": AttentionRates(((2, 2.0), (8, 8.0)), ((2, 4.0), (8, 16.0)), "")})
    assert kernels._layer(SPEC, Layout(cp=2), STACK, Timer(by_seq), HW, 8)["attention"] == pytest.approx(
        (256 + 320) * PS)
    # a link whose all-gather a probe timed apart: sequence parallel's gathers go at it, all-reduces do not
    probed = replace(HW, links=(Link("node", 1.0, 1e-6, busbw_by_kind={"all_gather": 0.25}), HW.links[1]))
    sp = kernels._layer(SPEC, Layout(tp=2, sp=True), STACK, TIMER, probed, 8)
    assert sp["tp_comm"] == pytest.approx(2 * 2 * (1e-6 + 0.5 * 128 / 0.25e9 + node(1, 0.5, 128)))
    assert kernels._layer(SPEC, Layout(tp=2), STACK, TIMER, probed, 8)["tp_comm"] == pytest.approx(
        2 * 2 * node(2, 1.0, 128))
    # overlap asked at one tensor-parallel rank splits nothing
    assert kernels._layer(SPEC, Layout(tp_overlap=True), STACK, TIMER, HW, 10)["gemm"] == pytest.approx(
        3 * 2 * 10 * (64 + 32 + 32 + 64 + 128 + 128) * PS)


def test_a_decoder_s_stages_under_each_option_hold_their_own_terms():
    # tensor parallel without a split vocabulary: the embedding and output layer whole on every rank
    tp = kernels.decoder_stages(SPEC, Layout(tp=2), 1, HW, STACK, COMPUTE)
    assert tp.optimizer == pytest.approx([(4 * 464 / 2 + 256 + 264) * 8 * PS], rel=1e-12)
    assert tp.inside == [] or tp.collectives == [[]]
    vocab = kernels.decoder_stages(SPEC, Layout(tp=2, pp=2, micro_batches=2, vocab_split=True), 2, HW, STACK,
                                   COMPUTE)
    assert vocab.optimizer == pytest.approx([(2 * 232 + 128) * 8 * PS, (2 * 232 + 132) * 8 * PS], rel=1e-12)
    assert vocab.collectives[0][0].nbytes == 2 * 4 * 8                      # without sp, the whole activations
    layer = kernels._layer(SPEC, Layout(tp=2), STACK, TIMER, HW, 4)
    embed = 4 * 8 * 2 * 4 * PS
    assert vocab.compute[0] == pytest.approx(2 * (layer["fwd"] + layer["bwd"]) + embed, rel=1e-12)
    # two stages within a node: the sends on the node link; one stage sends nothing
    pp = kernels.decoder_stages(SPEC, Layout(pp=2, micro_batches=2), 2, HW, STACK, COMPUTE)
    assert pp.inside == pytest.approx([2 * node(1, 1.0, 64)] * 2, rel=1e-12)
    alone = kernels.decoder_stages(SPEC, Layout(dp=2, zero1=True), 2, HW, STACK, COMPUTE)
    assert alone.inside == [0.0] and [c.kind for c in alone.collectives[0]] == ["reduce_scatter", "all_gather"]
    # context parallel: each layer's ring left exposed, inside the micro-batch
    cp = kernels.decoder_stages(SPEC, Layout(cp=2), 1, HW, STACK, COMPUTE)
    cp_layer = kernels._layer(SPEC, Layout(cp=2), STACK, TIMER, HW, 2)
    assert cp.inside == pytest.approx([4 * cp_layer["cp_exposed"]]) and cp_layer["cp_exposed"] > 0
    # a micro-batch size: 2 micro-batches of 1 on each of 2 replicas, each in flight on the first stage
    sized = Layout(dp=2, pp=2, micro_batch_size=1)
    mbs = kernels.decoder_stages(SPEC, sized, 4, HW, STACK, COMPUTE)
    assert mbs.micro_batches == 2 and mbs.memory["model_per_rank"][0] == decoder_rank_bytes(
        SPEC, sized, 4, 2 * 464 + 256, 464, 2, 2, False, "attention", 0, 2)
    # recomputation: the stage's own; 1F1B holds fewer micro-batches on the later stage
    rc = Layout(pp=2, micro_batches=4, schedule="1f1b", recompute="selective")
    out = kernels.decoder_stages(SPEC, rc, 4, HW, replace(STACK, selective="odd-mm"), COMPUTE)
    rc_layer = kernels._layer(SPEC, rc, replace(STACK, selective="odd-mm"), TIMER, HW, 4)
    assert out.recompute == pytest.approx([2 * rc_layer["recompute"]] * 2) and rc_layer["recompute"] > 0
    assert out.memory["model_per_rank"] == [
        decoder_rank_bytes(SPEC, rc, 4, 2 * 464 + 256, 464, 2, 4, False, "odd-mm", 0, 2),
        decoder_rank_bytes(SPEC, rc, 4, 2 * 464 + 264, 464, 2, 4, True, "odd-mm", 1, 2)]


def test_a_decoder_is_timed_by_its_device_s_table_or_by_an_assumed_mfu():
    from common.predict import hardware as hardware_files
    from common.predict.basis import from_mfu
    from common.predict.gpu_compute import compute_for

    h100 = hardware_files.load("h100-sxm-8")
    assert kernels.device_compute(h100) == compute_for(h100)
    assumed = kernels.device_compute(h100, 0.5)
    assert assumed == from_mfu(0.5, h100, "bf16") and assumed.flops_per_s == pytest.approx(0.5 * 989.5e12)
    with pytest.raises(ValueError, match=r"^global batch 2 is not divisible by data parallel 3 x micro-batches 1"):
        kernels.decoder_stages(SPEC, Layout(dp=3), 2, HW, STACK, COMPUTE)


def test_a_copy_of_a_device_at_another_scale_times_its_gemms_again():
    gemm = Gemm("g", 4, 4, 8)
    once = COMPUTE.gemm_s(gemm)
    assert once == 256 * PS and COMPUTE.gemm_s(gemm) == once
    assert replace(COMPUTE, scale=0.5).gemm_s(gemm) == pytest.approx(2 * once, rel=1e-12)


def test_every_gemm_a_stage_times_has_whole_dimensions():
    # published.gemm_shapes hands these shapes to the GPU probe, whose tensors take whole sizes only
    shapes = []

    class Recording(DeviceCompute):
        def gemm_s(self, gemm, precision="bf16"):
            shapes.append((gemm.m, gemm.n, gemm.k))
            return super().gemm_s(gemm, precision)

    kernels.decoder_stages(SPEC, Layout(dp=2, cp=2, micro_batches=2), 8, HW, STACK, Recording(**arguments_of(COMPUTE)))
    assert (4, 4, 8) in shapes and all(type(v) is int for shape in shapes for v in shape)


def test_a_decoder_rank_holds_its_parameters_state_in_bytes_per_parameter_by_hand():
    """One more parameter on a stage costs, whatever the activations: bf16 weights 2 + float32 gradients 4 + float32
    master weights and two AdamW moments 12 = 18 bytes; with ZeRO-1 over dp 4 the last 12 sharded: 2 + 4 + 3 = 9;
    under FSDP 4 float32 weights, gradients and moments sharded: 16 / 4 = 4."""
    def per_parameter(layout: Layout) -> float:
        def held(params: float) -> float:
            return decoder_rank_bytes(SPEC, layout, 4, params, 464, 2, 1, True, "attention", 0, 1)
        return held(1e6 + 1000) / 1000 - held(1e6) / 1000
    assert per_parameter(Layout(dp=4)) == pytest.approx(18)
    assert per_parameter(Layout(dp=4, zero1=True)) == pytest.approx(9)
    assert per_parameter(Layout(fsdp=4)) == pytest.approx(4)


def test_a_decoder_layer_s_activations_held_per_recompute_policy_by_hand():
    """One more layer on a stage (4 tokens, tp 2, one micro-batch in flight): without recompute, what the layer
    stores (flash attention; with sp the norms' inputs split too); torchtitan's op policy keeps the 1st, 3rd and
    5th GEMMs' outputs (wq 4, wv 2, w1 8 columns a rank: 14), the attention's output (8 / 2), the block's input
    (8 / 2 under sp, else 8) in bf16 and the log-sum-exp (2 heads / 2) in float32: 4 x (2 x 22 + 4) = 192 bytes,
    224 without sp; full recompute keeps the block's input alone: 4 x 8 x 2 / 2 = 32, 64 without sp. Megatron's
    selective recompute (the attention core) keeps what flash attention keeps anyway."""
    def per_layer(layout: Layout, selective: str = "attention") -> float:
        def held(layers: int) -> float:
            return decoder_rank_bytes(SPEC, layout, 4, 1000.0, 464, layers, 1, False, selective, 0, 1)
        return held(3) - held(2)
    sp = Layout(tp=2, sp=True)
    assert per_layer(sp) == SPEC.stored_activation_bytes(4, 2, True, flash=True) == 368
    assert per_layer(sp, "odd-mm") == 368                         # the policy applies to selective recompute only
    assert per_layer(replace(sp, recompute="selective")) == 368
    assert per_layer(replace(sp, recompute="selective"), "odd-mm") == 192
    assert per_layer(Layout(tp=2, recompute="selective"), "odd-mm") == 224
    assert per_layer(replace(sp, recompute="full")) == 32
    assert per_layer(Layout(tp=2, recompute="full")) == 64
