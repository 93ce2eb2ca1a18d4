"""common.predict.step on a toy BERT and a toy machine, by hand: 1 GB/s links without latency (a collective of B
bytes takes its bus factor x B ns), 1 ns per multiply-add of a sample, 1 ns per parameter updated, 10 ms a step.
The toy BERT (tests/test_stage_split.py's): 214 parameters; per sample 80 multiply-adds a layer, 24 the head."""
from __future__ import annotations

from dataclasses import replace

import pytest

from common.layout import Layout
from common.predict.basis import Basis
from common.predict.collectives import Collective, bus_factor, cost_s, message_steps
from common.predict.executed import TP_UNPROFILED, collectives, memory_per_rank
from common.predict.hardware import Hardware, Link
from common.predict.memory import state_bytes
from common.predict.step import predict, sync_factor
from common.predict.work import ComputeShares, rank_macs, stage_layer_counts
from common.spec import BERT_SIZES, BertSpec

TOY = BertSpec("toy", layers=3, hidden=2, heads=1, intermediate=4, seq_len=2, vocab_size=10)
PARAMS, MACS = 32 + 3 * 54 + 20, 3 * 80 + 24
GPU = Hardware(name="toy", description="", device_kind="cuda", device_name="", devices_per_node=2,
               memory_bytes=10**6, links=(Link("node", 1.0, 0.0), Link("network", 0.5, 0.0)))
BASIS = Basis(s_per_mac_sample=1e-9, s_per_micro_batch=0.0, s_per_param=1e-9, s_per_step=0.01, memory_overhead=100.0,
              training_overhead=10.0, threads_per_device=None, cores=None, label="toy")


def test_ring_costs_by_kind():
    assert [bus_factor(k, 4) for k in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv",
                                       "broadcast")] == [1.5, 0.75, 0.75, 0.75, 1.0, 1.0]
    assert [message_steps(k, 4) for k in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                                          "send_recv")] == [6, 3, 3, 3, 3, 1]
    assert cost_s("send_recv", 1, 2, Link("node", 1.0, 1.0)) == pytest.approx(1.0 + 1e-9)  # one byte still costs
    with pytest.raises(ValueError, match="unknown collective kind 'gossip'"):
        bus_factor("gossip", 2)
    assert cost_s("all_gather", 0, 4, Link("node", 1.0, 1.0)) == 0.0
    assert cost_s("all_gather", 4e9, 4, Link("node", 2.0, 1e-3)) == pytest.approx(3e-3 + 1.5)


def test_data_parallel_by_hand():
    """dp2, 4 samples a rank: 1056 ns of compute, the 856 gradient bytes all-reduced over 2 (factor 1), 214 ns of
    AdamW, the 10 ms step."""
    p = predict(TOY, Layout(dp=2), 8, GPU, BASIS)
    assert p.compute_s == pytest.approx(4 * MACS * 1e-9) and p.comm_exposed_s == pytest.approx(4 * PARAMS * 1e-9)
    assert p.optimizer_s == pytest.approx(PARAMS * 1e-9) and p.overhead_s == 0.01 and p.bubble_s == 0.0
    assert p.step_s == pytest.approx(0.01 + (4 * MACS + 4 * PARAMS + PARAMS) * 1e-9, rel=1e-12)
    assert p.samples_per_s == pytest.approx(8 / p.step_s) and p.sync_wait_s == 0.0 and p.idle_per_stage is None
    assert p.parts_s == {"compute": p.compute_s, "comm_exposed": p.comm_exposed_s, "bubble": 0.0,
                         "optimizer": p.optimizer_s, "overhead": 0.01, "sync_wait": 0.0}
    assert (p.devices, p.global_batch, p.contention, p.notes) == (2, 8, 1.0, [])
    # across nodes (4 devices on nodes of 2): the network's 0.5 GB/s, factor 2 x 3/4
    p4 = predict(TOY, Layout(dp=4), 16, GPU, BASIS)
    assert p4.comm_exposed_s == pytest.approx(1.5 * 4 * PARAMS / 0.5e9)
    # memory: the model's count plus the basis' overheads, per rank
    assert p.memory_per_rank == pytest.approx([m + 100 for m in p.model_per_rank])
    assert p.training_per_rank == pytest.approx([g + 10 for g in p.training_model_per_rank])
    assert p.fits(max(p.memory_per_rank)) and not p.fits(max(p.memory_per_rank) - 1)
    bare = predict(TOY, Layout(dp=2), 8, GPU, replace(BASIS, memory_overhead=None, training_overhead=None))
    assert bare.memory_per_rank is None and bare.training_per_rank is None and bare.fits(max(bare.model_per_rank))


def test_a_pipeline_by_hand():
    """pp2 of 4 micro-batches of 2: stage 0 computes two layers (2 x 160 ns), stage 1 a layer and the head
    (2 x 104 ns); each sends 8 activations and gradients of 32 bytes (256 ns, 64 ns a micro-batch); the step
    is sum + 3 x max of the stages, then the tied embedding's 80-byte all-reduce and the busier optimizer."""
    p = predict(TOY, Layout(pp=2, micro_batches=4), 8, GPU, BASIS)
    e0, e1 = 320e-9 + 64e-9, 208e-9 + 64e-9
    pipe = e0 + e1 + 3 * e0
    tail = 80e-9 + 140e-9  # the tie's all-reduce, then stage 0's 140 parameters (stage 1: 94)
    assert p.step_s == pytest.approx(0.01 + pipe + tail, rel=1e-12)
    assert p.compute_s == pytest.approx(4 * 320e-9) and p.bubble_s == pytest.approx(pipe - 4 * e0)
    assert p.comm_exposed_s == pytest.approx(4 * 64e-9 + 80e-9) and p.optimizer_s == pytest.approx(140e-9)
    assert p.idle_per_stage == pytest.approx([(pipe - 4 * e0) / (pipe + 80e-9), (pipe - 4 * e1) / (pipe + 80e-9)])
    kinds = [(c.kind, c.dim, c.calls, c.nbytes) for c in p.collectives_of_rank0]
    assert kinds == [("send_recv", "pp", 8, 32), ("all_reduce", "tie", 1, 80)]
    assert len(p.collectives) == 4 and len(p.state_per_rank) == 2


def test_tensor_parallel_and_fsdp_by_hand():
    # tp2: per layer and micro-batch 2 all-reduces of the 4 x 2 x 2 activations forward and 2 of their gradients
    # backward (64 bytes each), inside the step
    p = predict(TOY, Layout(tp=2), 4, GPU, BASIS)
    assert [(c.kind, c.calls, c.nbytes) for c in p.collectives] == [("all_reduce", 6, 64), ("all_reduce", 6, 64)]
    assert p.comm_exposed_s == pytest.approx(12 * 64e-9)
    assert p.compute_s == pytest.approx(4 * (3 * 40 + 24) * 1e-9)
    # the split vocabulary's all-reduces are on the critical path too: the embedding's 64 bytes, the loss's 3 x 16
    # and 32 forward, 32 backward
    split = predict(TOY, Layout(tp=2, vocab_split=True), 4, GPU, BASIS)
    assert split.comm_exposed_s == pytest.approx((12 * 64 + 64 + 3 * 16 + 32 + 32) * 1e-9)
    # FSDP over 2: gathers of each layer twice and the root once, one scatter per unit, exposed on this GPU
    fsdp = predict(TOY, Layout(fsdp=2), 8, GPU, BASIS)
    gathers, scatters = fsdp.collectives
    assert (gathers.kind, gathers.calls, scatters.kind, scatters.calls) == ("all_gather", 7, "reduce_scatter", 4)
    assert gathers.total_bytes == pytest.approx(4 * (2 * 3 * 54 + 52)) and scatters.total_bytes == \
        pytest.approx(4 * PARAMS)
    exposed = 0.5 * (gathers.total_bytes + scatters.total_bytes) * 1e-9
    assert fsdp.comm_exposed_s == pytest.approx(exposed)
    # where collectives run beside the compute, only what exceeds it, or one call of each, is exposed
    overlapping = replace(GPU, comm_overlaps_compute=True)
    hidden = predict(TOY, Layout(fsdp=2), 8, overlapping, BASIS)
    fb = 4 * MACS * 1e-9
    assert hidden.comm_exposed_s == pytest.approx(max(0.5 * gathers.total_bytes * 1e-9 / 7,
                                                      0.5 * gathers.total_bytes * 1e-9 - fb)
                                                  + max(0.5 * scatters.total_bytes * 1e-9 / 4,
                                                        0.5 * scatters.total_bytes * 1e-9 - fb))
    ddp = predict(TOY, Layout(dp=2), 8, overlapping, BASIS, backend="torch_ddp")
    assert ddp.comm_exposed_s == pytest.approx(max(4 * PARAMS * 1e-9, 4 * PARAMS * 1e-9 - 2 / 3 * fb))
    assert predict(TOY, Layout(dp=2), 8, overlapping, BASIS).comm_exposed_s == pytest.approx(4 * PARAMS * 1e-9)


def test_tensor_parallel_divides_what_the_profile_says_it_divides():
    """Shares 50% matmuls, 20% split with the heads, 10% the loss's softmax, 20% whole. tp2, per sample: the
    matmuls' 3 x 40 + 24 multiply-adds at half weight, and of the 1-device 264, 0.2 / 2 + 0.1 + 0.2; with the
    vocabulary split the head's 20 and the softmax divide too: 0.5 x (120 + 4 + 10) + 264 x (0.1 + 0.05 + 0.2)."""
    shares = ComputeShares(matmul=0.5, split=0.2, vocab=0.1, whole=0.2, run_id="prof")
    profiled = replace(BASIS, compute_shares=shares, record_ids=("prof",))
    assert predict(TOY, Layout(tp=2), 4, GPU, profiled).compute_s == pytest.approx(4 * (0.5 * 144 + 264 * 0.4) * 1e-9)
    # the fixed cost per micro-batch stays one per micro-batch: a tp rank launches every kernel, shares or not
    launches = replace(profiled, s_per_micro_batch=1e-6)
    assert predict(TOY, Layout(tp=2), 4, GPU, launches).compute_s == pytest.approx(
        1e-6 + 4 * (0.5 * 144 + 264 * 0.4) * 1e-9)
    vocab = predict(TOY, Layout(tp=2, vocab_split=True), 4, GPU, profiled)
    assert vocab.compute_s == pytest.approx(4 * (0.5 * 134 + 264 * 0.35) * 1e-9)
    # without tensor parallelism the shares change nothing: every operation is the rank's own share of the samples
    assert predict(TOY, Layout(dp=2), 8, GPU, profiled).compute_s == pytest.approx(4 * MACS * 1e-9)
    # a pipeline stage's rest goes with its own layers: stage 0's one layer, stage 1's two and the head
    counts = stage_layer_counts(Layout(pp=2), 3)
    assert rank_macs(TOY, Layout(pp=2, tp=2), shares) == pytest.approx(
        [0.5 * 40 * counts[0] + 0.4 * 80 * counts[0], 0.5 * (40 * counts[1] + 24) + 0.4 * (80 * counts[1] + 24)])
    # recomputed: the layers' forward again, divided alike (the head is kept)
    assert rank_macs(TOY, Layout(tp=2, recompute="full"), shares, recomputed=True) == pytest.approx([
        0.5 * 120 + 0.4 * 240])
    # an unprofiled measured basis says its tensor parallel prediction is too fast; an assumed MFU has no profile
    unprofiled = predict(TOY, Layout(tp=2), 4, GPU, replace(BASIS, record_ids=("plain",)))
    assert unprofiled.notes == [TP_UNPROFILED] and unprofiled.compute_s == pytest.approx(4 * 144 * 1e-9)
    assert predict(TOY, Layout(tp=2), 4, GPU, BASIS).notes == []


def test_a_cpu_host_s_contention_and_interruptions():
    cpu = replace(GPU, device_kind="cpu", devices_per_node=8)
    basis = replace(BASIS, threads_per_device=1, cores=2, background=0.5, interruption_share=0.1)
    alone = predict(TOY, Layout(dp=2), 8, cpu, basis)                # 2 ranks on 2 cores: no contention
    assert alone.contention == 1.0 and alone.notes == []
    busy = predict(TOY, Layout(dp=4), 16, cpu, basis, background=1.0)  # (4 + 1) / 2 over max(1, 1.5 / 2)
    assert busy.contention == pytest.approx(2.5)
    assert busy.compute_s == pytest.approx(2.5 * 4 * MACS * 1e-9) and busy.overhead_s == pytest.approx(0.025)
    assert busy.notes == ["contention: 4 ranks x 1 threads + 1.0 other runnable on 2 cores: compute x2.50"]
    quiet = predict(TOY, Layout(dp=4), 16, cpu, basis)                 # no background given: none either side
    assert quiet.contention == 2.0 and quiet.notes == ["contention: 4 ranks x 1 threads on 2 cores: compute x2.00"]
    # interruptions: dp2 waits for the longer of two (H_2 = 1.5): half its own share more
    without = alone.step_s - alone.sync_wait_s
    assert alone.sync_wait_s == pytest.approx(0.1 * without * 0.5)
    assert predict(TOY, Layout(dp=2), 8, GPU, basis).sync_wait_s == 0.0
    assert sync_factor(Layout(dp=3)) == pytest.approx(1 + 1 / 2 + 1 / 3)
    assert sync_factor(Layout(fsdp=3, tp=2)) == 6


def test_ranks_side_by_side_on_a_cpu_host_take_the_co_run_probe_s_slowdown_and_one_rank_does_not():
    cpu = replace(GPU, device_kind="cpu", devices_per_node=8)
    basis = replace(BASIS, threads_per_device=1, cores=2, co_run=1.04)
    side = predict(TOY, Layout(dp=2), 8, cpu, basis)
    assert side.contention == pytest.approx(1.04) and side.compute_s == pytest.approx(1.04 * 4 * MACS * 1e-9)
    assert side.notes == ["contention: 2 ranks x 1 threads on 2 cores, side by side x1.040: compute x1.04"]
    crowded = predict(TOY, Layout(dp=4), 16, cpu, basis)               # oversubscribed, and side by side too
    assert crowded.contention == pytest.approx(2 * 1.04)
    assert predict(TOY, Layout(), 4, cpu, basis).contention == 1.0    # one rank: alone, as measured
    assert predict(TOY, Layout(dp=2), 8, GPU, basis).contention == 1.0  # a GPU's ranks have devices of their own


def test_names_at_a_device_count_and_where_their_groups_lie():
    from common.layout import check_name
    from common.predict.collectives import crosses_nodes, group_stride

    assert Layout.parse("dp", 8) == Layout(dp=8) and Layout.parse("fsdp", 8) == Layout(fsdp=8)
    assert Layout.parse("dp-rc", 4) == Layout(dp=4, recompute="full") and Layout.parse("fsdp", 1) == Layout()
    assert Layout.parse("fsdpxtp2", 8) == Layout(fsdp=4, tp=2)
    assert Layout.parse("tp2", 8) == Layout(dp=4, tp=2) and Layout.parse("dp2xtp2", 4) == Layout(dp=2, tp=2)
    assert Layout.parse("pp2-1f1b", 2) == Layout(pp=2, micro_batches=4, schedule="1f1b")
    assert Layout.parse("dpxtp2xpp2", 8) == Layout(dp=2, tp=2, pp=2, micro_batches=4)
    for entry, devices, message in (("tp3", 8, r"'tp3' at 8 devices: the other dimensions \(3\) do not divide them"),
                                    ("tp3xdp", 8, r"the other dimensions \(3\) do not divide them"),
                                    ("dp2xtp2", 8, "'dp2xtp2' uses 4 devices, not 8"),
                                    ("dp-fast", 8, "unknown option 'fast'")):
        with pytest.raises(ValueError, match=message):
            Layout.parse(entry, devices)
    check_name("fsdpxtp8xpp4-1f1b")
    with pytest.raises(ValueError, match="'dpxep2': expert parallelism is not modelled"):
        check_name("dpxep2")
    with pytest.raises(ValueError, match="'dp2xtp2xfsdp4-sel-fast': unknown option 'fast'"):
        check_name("dp2xtp2xfsdp4-sel-fast")   # whatever the device count: the name's own fault
    check_name("dp2xtp2xfsdp4-sel")   # HSDP at 16 devices: no device count given, none objected to
    grid = Layout(dp=2, tp=4, pp=2, micro_batches=2)
    assert [group_stride(grid, d) for d in ("tp", "dp", "pp")] == [1, 4, 8]
    assert not crosses_nodes(grid, "tp", 4) and crosses_nodes(grid, "tp", 3) and crosses_nodes(grid, "dp", 4)
    assert not crosses_nodes(grid, "dp", 8) and not crosses_nodes(Layout(tp=4), "dp", 1)
    # the one rank order, outermost first: pp, dp, fsdp, cp, tp; the data ranks (dp x fsdp) contiguous
    hsdp = Layout(dp=2, fsdp=4, tp=2, cp=2)
    assert [group_stride(hsdp, d) for d in ("tp", "cp", "fsdp", "data", "dp")] == [1, 2, 4, 4, 16]
    assert group_stride(replace(hsdp, pp=2), "pp") == 2 * 2 * 8      # past every tp x cp x data rank of a stage
    assert hsdp.coordinates(2 * 2 * 4 + 5) == {"pp": 0, "dp": 1, "fsdp": 1, "cp": 0, "tp": 1, "data": 5}
    assert crosses_nodes(hsdp, "fsdp", 8) and not crosses_nodes(hsdp, "fsdp", 8, ranks=2)


def test_each_collective_a_rank_issues_in_full():
    from dataclasses import astuple

    def issued(layout, batch=8, stage=0, backend="torch_3d", spec=TOY):
        return [astuple(c) for c in collectives(spec, layout, batch, stage, backend)]
    tp_acts, tp_grads = "tensor-parallel activations", "tensor-parallel input gradients"
    tp = [("all_reduce", "tp", 64, 6, 2, True, tp_acts), ("all_reduce", "tp", 64, 6, 2, True, tp_grads)]
    assert issued(Layout(tp=2), 4) == tp
    assert issued(Layout(dp=2, tp=2), 9)[:2] == tp  # 9 // 2 a rank
    pipe = Layout(pp=2, micro_batches=4)
    sends, tie = "pipeline activations and their gradients", "tied embedding gradient"
    assert issued(pipe) == [("send_recv", "pp", 32, 8, 2, True, sends), ("all_reduce", "tie", 80, 1, 2, True, tie)]
    assert issued(Layout(pp=3, micro_batches=3), 6, 1) == [("send_recv", "pp", 32, 12, 2, True, sends)]
    split_vocab = issued(Layout(tp=2, pp=2, micro_batches=2, vocab_split=True), 8, 1)
    assert split_vocab[-1] == ("all_reduce", "tie", 40, 1, 2, True, tie)  # half the table's rows on each rank
    assert issued(Layout(dp=2)) == [("all_reduce", "data", 4 * PARAMS, 1, 2, True, "gradient all-reduce")]
    gathers, scatters = "FSDP parameter all-gathers", "FSDP gradient reduce-scatters"
    assert issued(Layout(fsdp=2)) == [
        ("all_gather", "data", pytest.approx(4 * (2 * 3 * 54 + 52) / 7), 7, 2, True, gathers),
        ("reduce_scatter", "data", pytest.approx(4 * PARAMS / 4), 4, 2, True, scatters)]
    # ZeRO-2 gathers each layer once, for its forward (the root too, as always)
    assert issued(Layout(fsdp=2, zero2=True))[0] == \
        ("all_gather", "data", pytest.approx(4 * (3 * 54 + 52) / 4), 4, 2, True, gathers)
    # two micro-batches gather every unit twice as often; a recorded split gives the stage its units
    fsdp_pipe = Layout(fsdp=2, pp=2, micro_batches=2)
    assert issued(replace(fsdp_pipe, stage_split="1,2"), 8, 0)[-2][2:4] == (pytest.approx(4 * 2 * (2 * 54 + 32) / 6), 6)
    from common.spec import CNN
    cnn = CNN.param_count()
    assert issued(Layout(fsdp=2), spec=CNN) == [
        ("all_gather", "data", pytest.approx(4 * cnn), 1, 2, True, gathers),
        ("reduce_scatter", "data", pytest.approx(4 * cnn), 1, 2, True, scatters)]
    assert issued(Layout(fsdp=1)) == []
    from common.spec import BERT_SIZES
    base = BERT_SIZES["base"].param_count()
    [ddp] = issued(Layout(dp=2), backend="torch_ddp", spec=BERT_SIZES["base"])
    assert ddp[3] == -(-4 * base // (25 * 2**20)) and ddp[2] == pytest.approx(4 * base / ddp[3])


def test_tensor_parallel_recompute_and_split_vocabulary_by_hand():
    """torch_3d's all-reduces over tp, per micro-batch (TOY at batch 4: 4 x 2 x 2 hidden states, 4 x 1 masked
    positions): --recompute repeats the 2 forward ones per layer; --vocab-split adds the embedding's partial sums
    on the first stage, and on the last the loss's max, sum of exponentials and target logit (float32), the
    index of the maximum (int64), and backward the head output's gradient (4 x 1 x 2 values)."""
    from dataclasses import astuple

    def issued(layout, stage=0, value_bytes=4, device_kind="cpu"):
        return [astuple(c)[2:4] + astuple(c)[-1:] for c in collectives(TOY, layout, 4, stage, "torch_3d", value_bytes,
                                                                       device_kind)]
    acts, grads = "tensor-parallel activations", "tensor-parallel input gradients"
    assert issued(Layout(tp=2, recompute="full")) == [(64, 12, acts + " (the recomputed forward's too)"),
                                                      (64, 6, grads)]
    embedding = (64, 1, "split embedding's partial sums")
    loss = [(16, 3, "split loss's maximum, sum of exponentials and target logit"),
            (32, 1, "split loss's index of the maximum (the correct count)")]
    head = "split loss's gradient of the head's output"
    assert issued(Layout(tp=2, vocab_split=True)) == [(64, 6, acts), (64, 6, grads), embedding, *loss, (32, 1, head)]
    # bf16 autocast: the row-split matmuls' outputs and, on a CPU, the head's LayerNorm output in 2 bytes; the
    # input gradients, the embedding and the loss's reductions stay float32, as does the head's output on CUDA
    half = Layout(tp=2, vocab_split=True)
    assert issued(half, value_bytes=2) == [(32, 6, acts), (64, 6, grads), embedding, *loss, (16, 1, head)]
    assert issued(half, value_bytes=2, device_kind="cuda")[-1] == (32, 1, head)
    # a pipeline: the embedding on the first stage, the loss on the last, each stage's layers' all-reduces
    piped = Layout(tp=2, pp=2, micro_batches=2, vocab_split=True, stage_split="2,1")
    tp_first = [c for c in issued(piped, 0) if c[2] != "pipeline activations and their gradients"]
    assert tp_first[:3] == [(32, 2 * 2 * 2, acts), (32, 2 * 2 * 2, grads), (32, 2, embedding[2])]
    last = [c[1:] for c in issued(piped, 1) if c[2].startswith("split")]
    assert last == [(2 * 3, loss[0][2]), (2, loss[1][2]), (2, head)]


def test_predict_s_less_travelled_paths_by_hand():
    # collectives a compiler placed (keras_jax's comm_per_step): costed over every device, across nodes at 4 on
    # nodes of 2; a pipeline ignores them
    counted = [Collective("all_reduce", "all", 1000.0, 3, 4, True, "as compiled")]
    p = predict(TOY, Layout(dp=4), 16, GPU, BASIS, backend="keras_jax", counted=counted)
    assert p.comm_exposed_s == pytest.approx(3 * 1.5 * 1000 / 0.5e9) and p.collectives == counted
    # at 2 devices (one node) the node link, the collective over its own 4 ranks
    assert predict(TOY, Layout(dp=2), 8, GPU, BASIS, counted=counted).comm_exposed_s == pytest.approx(3 * 1.5 * 1000e-9)
    assert predict(TOY, Layout(pp=2, micro_batches=4), 8, GPU, BASIS, counted=counted).collectives != counted
    # a fixed cost per micro-batch goes with the layers' share of the whole model's multiply-adds; tp keeps it whole
    fixed = replace(BASIS, s_per_micro_batch=1e-3, s_per_mac_sample=0.0)
    assert predict(TOY, Layout(tp=2), 4, GPU, fixed).compute_s == pytest.approx(1e-3 * (120 + 24) / (120 + 24))
    piped = predict(TOY, Layout(pp=2, micro_batches=4), 8, GPU, fixed)
    assert piped.compute_s == pytest.approx(4 * 1e-3 * 160 / MACS)  # stage 0: two layers of the whole
    # the tied embedding's all-reduce crosses nodes when its two stages do (stride 2 x 1 on nodes of 2)
    tie = predict(TOY, Layout(dp=2, pp=2, micro_batches=2), 16, GPU, BASIS)
    assert [c.dim for c in tie.collectives_of_rank0] == ["pp", "tie", "data"]
    far = [c for c in tie.collectives_of_rank0 if c.dim == "tie"][0]
    assert cost_s("all_reduce", far.nbytes, 2, GPU.link(True)) == pytest.approx(far.nbytes / 0.5e9)
    # DDP's buckets hide behind two thirds of a long backward, at least one bucket exposed
    slow = replace(BASIS, s_per_mac_sample=1e-3)
    overlapping = replace(GPU, comm_overlaps_compute=True)
    ddp = predict(TOY, Layout(dp=2), 8, overlapping, slow, backend="torch_ddp")
    assert ddp.comm_exposed_s == pytest.approx(4 * PARAMS * 1e-9)  # one bucket: all of it, whatever the backward
    # under autocast the activations a pipeline sends are 2 bytes a value
    half = predict(TOY, Layout(pp=2, micro_batches=4), 8, GPU, replace(BASIS, precision="amp"))
    assert half.collectives_of_rank0[0].nbytes == 16
    # contention with two threads a rank and the reference's own background
    cpu = replace(GPU, device_kind="cpu", devices_per_node=8)
    busy = replace(BASIS, threads_per_device=2, cores=2, background=1.0)
    assert predict(TOY, Layout(dp=2), 8, cpu, busy, background=1.0).contention == pytest.approx((5 / 2) / (3 / 2))
    assert predict(TOY, Layout(dp=2), 8, cpu, busy).contention == pytest.approx(2.0)
    # memory of a Keras optimizer (one step counter), and an evaluation's values in the peak
    keras = predict(TOY, Layout(dp=2), 8, GPU, BASIS, backend="keras_jax")
    assert keras.state_per_rank[0].optimizer == 8 * PARAMS + 8
    evaluated = predict(TOY, Layout(dp=2), 8, GPU, BASIS, eval_batch=10**6)
    assert max(evaluated.model_per_rank) > max(predict(TOY, Layout(dp=2), 8, GPU, BASIS).model_per_rank)
    assert predict(TOY, Layout(dp=2), 8, GPU, BASIS).bubble_s == 0.0


def test_memory_per_rank_is_predict_s_count_without_a_time_basis():
    # The fit check before launch (common.plan.fit) asks memory_per_rank; the plan's table shows predict()'s.
    layout = Layout(dp=2, micro_batches=2)
    states, model, growth = memory_per_rank(TOY, layout, 16, None, eval_batch=64)
    p = predict(TOY, layout, 16, GPU, BASIS, eval_batch=64)
    assert (states, model, growth) == (p.state_per_rank, p.model_per_rank, p.training_model_per_rank)
    # 16 samples over 2 replicas x 2 micro-batches: micro-batches of 4, as dp2 of one micro-batch of 8 samples
    assert memory_per_rank(TOY, Layout(dp=2), 8, "fp32")[2] == growth
    # evaluating 64 samples at once holds more than training's micro-batch of 4
    assert all(e > t for e, t in zip(model, memory_per_rank(TOY, layout, 16, None)[1]))


def test_the_tied_embedding_s_all_reduce_takes_the_link_between_its_two_stages():
    """The first and last stages' ranks 0 and stride x (pp - 1): the network link once that reaches another node."""
    # pp2 on nodes of one device: test_a_pipeline_by_hand at the network's 0.5 GB/s, sends and tie alike
    apart = predict(TOY, Layout(pp=2, micro_batches=4), 8, replace(GPU, devices_per_node=1), BASIS)
    assert apart.comm_exposed_s == pytest.approx(4 * 128e-9 + 160e-9)
    # pp3 of one micro-batch of 2 on nodes of 2: ranks 0 and 2 on two nodes. Stages compute 160, 160, 208 ns and
    # send 32 bytes a call at 0.5 GB/s (2, 4, 2 calls of 64 ns): the middle stage is the busiest (416 ns), its
    # 256 ns of sends exposed, then the tie's 80 bytes over the network, 160 ns
    three = predict(TOY, Layout(pp=3), 2, GPU, BASIS)
    assert three.comm_exposed_s == pytest.approx(256e-9 + 160e-9)
    # the tail: the tie and stage 2's 94 parameters (a layer, the head, the table's copy) against 54 and 86
    assert three.step_s == pytest.approx(0.01 + (288 + 416 + 336) * 1e-9 + (160 + 94) * 1e-9, rel=1e-12)


def test_ddp_buckets_hide_behind_two_thirds_of_the_backward_and_nothing_else_does():
    mini = BERT_SIZES["mini"]
    overlapping = replace(GPU, comm_overlaps_compute=True)
    # mini's 11,812,610 float32 gradients in two 25 MiB buckets of 23,625,220 bytes, 23.6 ms each at 1 GB/s; a
    # forward+backward of 30 ms (a fixed 30 ms a micro-batch) hides 20 ms of the 47.25 ms
    assert mini.param_count() == 11_812_610
    fb = replace(BASIS, s_per_mac_sample=0.0, s_per_micro_batch=0.03)
    ddp = predict(mini, Layout(dp=2), 16, overlapping, fb, backend="torch_ddp")
    assert ddp.comm_exposed_s == pytest.approx(2 * 23_625_220e-9 - 2 / 3 * 0.03, rel=1e-12)
    # collectives placed by a compiler are not DDP's buckets: all of them exposed, whatever the backward
    counted = [Collective("all_reduce", "all", 1000.0, 3, 2, True, "as compiled")]
    slow = replace(BASIS, s_per_mac_sample=1e-3)
    placed = predict(TOY, Layout(dp=2), 8, overlapping, slow, backend="torch_ddp", counted=counted)
    assert placed.comm_exposed_s == pytest.approx(3 * 1000e-9)
    # the fixed cost per micro-batch of tensor parallel with the vocabulary split: its one stage is all the model
    fixed = replace(BASIS, s_per_micro_batch=1e-3, s_per_mac_sample=0.0)
    assert predict(TOY, Layout(tp=2, vocab_split=True), 4, GPU, fixed).compute_s == pytest.approx(1e-3, rel=1e-12)


def test_what_each_stage_holds_reaches_the_step():
    # the prediction says which layout it is of
    assert predict(TOY, Layout(dp=2), 8, GPU, BASIS).layout == Layout(dp=2)
    # the tied table's gradient all-reduce: the whole 10 x 2 table under tp2 (80 bytes), its 10 // 2 rows of a
    # rank with the vocabulary split (40 bytes); mini's 33,282 words over tp4: 8,320 rows of 256
    tie = {vocab: [c.nbytes for c in predict(TOY, Layout(tp=2, pp=2, micro_batches=2, vocab_split=not vocab), 8,
                                            GPU, BASIS).collectives_of_rank0 if c.dim == "tie"]
           for vocab in (True, False)}
    assert tie == {True: [80], False: [40]}
    mini = predict(BERT_SIZES["mini"], Layout(tp=4, pp=2, micro_batches=2, vocab_split=True), 8, GPU, BASIS)
    assert [c.nbytes for c in mini.collectives_of_rank0 if c.dim == "tie"] == [4 * 8320 * 256]
    # --recompute with the layers cut 1 + 2: stage 1 recomputes its two layers' forward (160 of 240 MACs a sample
    # forward+backward: a third more), 4 micro-batches of 2 samples
    again = predict(TOY, Layout(pp=2, micro_batches=4, recompute="full", stage_split="1,2"), 8, GPU, BASIS)
    assert again.recompute_s == pytest.approx(4 * 2 * 160 / 3 * 1e-9, rel=1e-12)
    # each stage's optimizer steps its own parameters: cut 1 + 2, stage 1 holds two layers, the head and the
    # table's copy (108 + 20 + 20 = 148), stage 0 the embeddings and a layer (86); under dp2 and under tp2
    cut = predict(TOY, Layout(dp=2, pp=2, micro_batches=2, stage_split="1,2"), 16, GPU, BASIS)
    assert cut.optimizer_s == pytest.approx(148e-9, rel=1e-12)
    sharded = predict(TOY, Layout(tp=2, pp=2, micro_batches=2, stage_split="1,2"), 8, GPU, BASIS)
    stage1 = state_bytes(TOY, Layout(tp=2, pp=2, micro_batches=2, stage_split="1,2"), 2).params / 4
    assert sharded.optimizer_s == pytest.approx(stage1 * 1e-9, rel=1e-12) and stage1 > 86 / 2
    # six micro-batches accumulated on one device: no pipeline, no bubble, exactly
    assert predict(TOY, Layout(micro_batches=6), 12, GPU, BASIS).bubble_s == 0.0


def test_the_head_gradient_of_a_split_loss_travels_as_a_cpu_run_keeps_it_unless_told_the_device():
    """collectives() without a device kind is a CPU run's: under bf16 autocast the head's output gradient (4
    masked positions x hidden 2) goes in 2 bytes a value, 16 bytes; a CUDA run's LayerNorm output is float32."""
    layout = Layout(tp=2, vocab_split=True)
    assert collectives(TOY, layout, 4, 0, "torch_3d", 2)[-1].nbytes == 16
    assert collectives(TOY, layout, 4, 0, "torch_3d", 2, "cuda")[-1].nbytes == 32


@pytest.mark.parametrize("layout, flag", [
    (Layout(cp=2), "--context-parallel 2"), (Layout(dp=2, fsdp=2), "--fsdp 2"), (Layout(zero1=True), "--zero1"),
    (Layout(recompute="selective"), "--recompute selective"),
])
def test_what_torch_3d_does_not_execute_is_refused_in_one_line_naming_the_decoders_model(layout, flag):
    message = (f"{layout.name}: {flag} is not modelled for the executed workloads (their step model counts what "
               "torch_3d executes); the decoders' model does (bench.predict --model)")
    for refuse in (lambda: predict(TOY, layout, 8, GPU, BASIS), lambda: memory_per_rank(TOY, layout, 8, None)):
        with pytest.raises(ValueError) as err:
            refuse()
        assert str(err.value) == message


def test_the_executed_decoder_lm_from_a_measured_basis_by_hand():
    """The lm workload timed from a 1-device run (tests/test_predict_memory.py's toy decoder, 2 tokens a sequence):
    a layer's GEMMs 2 x 144 multiply-adds and causal attention's 16, 304; the untied output layer 2 x 10 x 4, 80;
    388 parameters (the 10 x 4 table, 2 x (144 + 2 x 4), the final norm 4 and the 10 x 4 output layer)."""
    from common.predict.work import Parts, parts
    from tests.test_predict_memory import DECODER
    assert parts(DECODER) == Parts(layer=304.0, layers=2, head_dense=0.0, head_vocab=80.0,
                                   layer_recomputed=304.0 - 2 * 8 * 4)   # not w2's 64, which feeds only the add
    one = predict(DECODER, Layout(), 4, GPU, BASIS)
    assert one.compute_s == pytest.approx(4 * 688e-9) and one.optimizer_s == pytest.approx(388e-9)
    # a pipeline sends 2 x 2 x 4 float32 hidden states each way, 2 micro-batches; no tied table to all-reduce
    pipe = predict(DECODER, Layout(pp=2, micro_batches=2), 4, GPU, BASIS)
    assert [(c.kind, c.dim, c.nbytes, c.calls) for c in pipe.collectives] == [("send_recv", "pp", 64, 4)] * 2
    assert pipe.compute_s == pytest.approx(2 * 2 * 384e-9)   # the busier last stage: a layer and the output layer
    # tp2 under --recompute: a pre-norm block's FFN all-reduce is not redone (1 more forward all-reduce a layer,
    # not 2), and the recomputed forward is the layers' without w2: 2 x 240 / 2 / 3 more multiply-adds a sample
    rc = predict(DECODER, Layout(tp=2, recompute="full"), 4, GPU, BASIS)
    assert [(c.nbytes, c.calls) for c in rc.collectives] == [(128, 2 * 3), (128, 2 * 2)]
    assert rc.compute_s == pytest.approx(4 * (384 + 80) * 1e-9)
    # a basis measured with --recompute holds the recomputation in its time per multiply-add: of the 688 + 160
    # it ran, the plain 688 share
    measured_rc = replace(BASIS, recompute=True)
    assert predict(DECODER, Layout(recompute="full"), 4, GPU, measured_rc).compute_s == pytest.approx(4 * 688e-9)
    assert predict(DECODER, Layout(), 4, GPU, measured_rc).compute_s == pytest.approx(4 * 688e-9 * 688 / 848)


def test_a_step_put_together_from_its_stages_by_hand():
    """Two stages of 4 micro-batches over 2 virtual chunks: per micro-batch stage 0 computes 3 and waits 1 inside
    (4), stage 1 computes 5 and waits 1 (6); interleaved 1F1B takes (4 + 6) / 2 + (4 - 1/2) x 6 = 26; after it the
    slower tail, stage 1's 1 + 3 + 0.25 against stage 0's 2 + 0.5 + 1; 10 of overhead."""
    from common.predict.prediction import Stages
    from common.predict.step import _step

    def stages():
        made = Stages(micro_batches=4, overhead=10.0, seq_len=7)
        made.add(compute=3.0, inside=1.0, after_comm=2.0, after_other=0.5, optimizer=1.0, parts={"attention": 1.0})
        made.add(compute=5.0, inside=1.0, recompute=0.5, after_comm=1.0, after_other=3.0, optimizer=0.25,
                 parts={"attention": 2.0})
        return made
    bare = Stages(micro_batches=1, overhead=0.0)
    bare.add(compute=3.0, inside=1.0)    # what a stage is not given it has none of
    assert (bare.recompute, bare.after_comm, bare.after_other, bare.optimizer, bare.collectives, bare.parts) == \
        ([0.0], [0.0], [0.0], [0.0], [[]], [{}])
    interleaved = Layout(pp=2, micro_batches=4, schedule="interleaved", virtual_stages=2)
    p = _step(stages(), interleaved, 8)
    assert p.step_s == 10 + 26 + 4.25 and p.bubble_s == 26 - 4 * 6
    assert (p.compute_s, p.comm_exposed_s, p.optimizer_s, p.recompute_s) == (4 * 5, 4 * 1 + 2, 1.0, 4 * 0.5)
    assert p.idle_per_stage == [(26 - 4 * 4) / (26 + 2), (26 - 4 * 6) / (26 + 2)]
    assert p.parts_s["attention"] == 2.0 and p.tokens_per_s == 8 * 7 / p.step_s
    # the same stages under plain 1F1B: sum + (m - 1) x max = 10 + 18
    assert _step(stages(), Layout(pp=2, micro_batches=4, schedule="1f1b"), 8).step_s == 10 + 28 + 4.25
    # the schedule interleaves, not the chunk count alone (a layout validate refuses, costed as asked)
    chunks = Layout(pp=2, micro_batches=4, schedule="1f1b", virtual_stages=2)
    assert _step(stages(), chunks, 8).step_s == 10 + 28 + 4.25
