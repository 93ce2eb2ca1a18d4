"""common.layout.Layout as an object: each combination it refuses, by the message a user reads; the ranks' grid,
what each rank holds, the record it writes, and the flags it gives back (bench.run's, and a data-parallel-only
backend's refusal)."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

from backends import BACKENDS, EXECUTED_BY
from common.errors import BadInput, Unsupported
from common.layout import OPTION, Layout, LayoutOption, Refused, check_name, cnn_layers, refuse_layout
from common.spec import BERT_SIZES, CNN, BertSpec

TINY, MINI = BERT_SIZES["tiny"], BERT_SIZES["mini"]  # tiny: 2 layers, 2 heads, hidden 128; mini: 4 layers


@pytest.mark.parametrize("layout, spec, batch, accum, message", [
    (Layout(dp=0), TINY, 8, 1, "parallel sizes must be >= 1: data 0 x 1, model 1, pipeline 1, context 1, "
                               "micro-batches 1"),
    (Layout(micro_batches=0), TINY, 8, 1, "parallel sizes must be >= 1: data 1 x 1, model 1, pipeline 1, context 1, "
                                          "micro-batches 0"),
    (Layout(pp=2, schedule="zb", micro_batches=2), TINY, 8, 1, "--pipeline-schedule zb: choose from gpipe, 1f1b, "
                                                               "interleaved"),
    (Layout(recompute="some"), TINY, 8, 1, "--recompute some: choose from none, selective, full"),
    (Layout(pp=2, micro_batches=2, schedule="interleaved"), MINI, 8, 1, "--pipeline-schedule interleaved with "
                                                                        "--virtual-stages 1: an interleaved"),
    (Layout(pp=2, micro_batches=3, schedule="interleaved", virtual_stages=2), MINI, 6, 1,
     "interleaved 1F1B needs the 3 micro-batches to be a multiple of the 2 stages (as Megatron requires)"),
    (Layout(pp=2, micro_batches=2, schedule="interleaved", virtual_stages=2), TINY, 8, 1,
     "2 layers cannot fill 4 pipeline stages"),
    (Layout(sp=True), TINY, 8, 1, "--sequence-parallel, --tp-overlap and --vocab-split need tensor parallelism "
                                  "(--model-parallel)"),
    (Layout(tp_overlap=True), TINY, 8, 1, "--sequence-parallel, --tp-overlap and --vocab-split need tensor"),
    (Layout(vocab_split=True), TINY, 8, 1, "--sequence-parallel, --tp-overlap and --vocab-split need tensor"),
    (Layout(fsdp=2, zero1=True), TINY, 8, 1, "--zero1 with --fsdp: ZeRO-1 shards the optimizer of plain data "
                                             "parallelism; FSDP already shards it"),
    (Layout(dp=2, zero2=True), TINY, 8, 1, "--zero2 needs --fsdp: it keeps FSDP's gathered parameters through the "
                                          "backward"),
    (Layout(fsdp=2, zero2=True), CNN, 8, 1, "--zero2: the CNN is one FSDP unit, the root, which FSDP keeps gathered "
                                            "through the backward already"),
    (Layout(micro_batch_size=2), TINY, 8, 1, "--micro-batch-size 2: the MLM's runs take the number of micro-batches"),
    (Layout(micro_batches=2, micro_batch_size=2), TINY, 8, 1, "--micro-batches 2 and --micro-batch-size 2: give"),
    (Layout(cp=3), TINY, 6, 1, "sequence 128 does not split into 2 x context parallel 3 chunks"),
    (Layout(cp=2), CNN, 8, 1, "--context-parallel, --sequence-parallel: the CNN has no sequence"),
    (Layout(micro_batches=2), TINY, 8, 1, "--micro-batches 2 with 1 pipeline stage: micro-batches feed a pipeline; "
                                          "use --grad-accum to accumulate without one"),
    (Layout(schedule="1f1b"), TINY, 8, 1, "--pipeline-schedule 1f1b with 1 pipeline stage: there is no pipeline"),
    (Layout(pp=2, micro_batches=1), TINY, 8, 1, "--micro-batches 1 is fewer than the 2 pipeline stages"),
    (Layout(stage_split="auto"), TINY, 8, 1, "--stage-split auto with 1 pipeline stage: there is no pipeline"),
    (Layout(pp=2, micro_batches=2), TINY, 8, 2, "--grad-accum 2 with 2 pipeline stages: the pipeline's "
                                               "--micro-batches already accumulate"),
    (Layout(dp=2, pp=2, micro_batches=2), TINY, 6, 1, "global batch 6 is not divisible by data parallel 2 x "
                                                      "micro-batches 2"),
    (Layout(fsdp=2, micro_batch_size=4), TINY, 12, 1, "global batch 12 is not divisible by data parallel 2 x "
                                                      "micro-batch size 4"),
    (Layout(tp=3), TINY, 8, 1, "attention heads 2 is not divisible by model parallel 3"),
    (Layout(tp=4, vocab_split=True), MINI, 8, 1, "vocabulary 33282 is not divisible by model parallel 4"),
    (Layout(pp=4, micro_batches=4), TINY, 8, 1, "2 layers cannot fill 4 pipeline stages"),
    (Layout(pp=2, micro_batches=2, stage_split="3,2"), MINI, 8, 1, "--stage-split 3,2: 2 stages of mini BERT's 4 "
                                                                   "layers need 2 counts that add up to 4"),
    (Layout(pp=2, micro_batches=2, stage_split="1,1,2"), MINI, 8, 1, "--stage-split 1,1,2: 2 stages"),
    (Layout(tp=3), CNN, 9, 1, "fc size 1024 is not divisible by model parallel 3"),
    (Layout(pp=8, micro_batches=8), CNN, 8, 1, "the CNN's 7 layers cannot fill 8 pipeline stages"),
    (Layout(tp=2, vocab_split=True), CNN, 8, 1, "--vocab-split: the CNN has no embedding table"),
    (Layout(pp=2, micro_batches=2, stage_split="auto"), CNN, 8, 1, "--stage-split auto: the CNN's pipeline is cut "
                                                                   "evenly; a split by cost places the MLM's"),
])
def test_a_combination_that_cannot_be_laid_out_is_named(layout, spec, batch, accum, message):
    with pytest.raises(BadInput) as err:
        layout.validate(spec, batch, accum)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("layout, spec, batch", [
    (Layout(), TINY, 1), (Layout(pp=2, micro_batches=2), TINY, 2), (Layout(dp=2, pp=2, micro_batches=2), TINY, 4),
    (Layout(tp=2, vocab_split=True), TINY, 8), (Layout(pp=2, micro_batches=2, schedule="1f1b"), TINY, 8),
    (Layout(pp=2, micro_batches=2, stage_split="3,1"), MINI, 8), (Layout(pp=2, micro_batches=2, stage_split="auto"),
                                                                    MINI, 8),
    (Layout(tp=2, pp=7, micro_batches=7), CNN, 7), (Layout(pp=4, micro_batches=4), MINI, 4),
    (Layout(dp=2, zero1=True), TINY, 8), (Layout(fsdp=2, zero2=True), TINY, 8),
])
def test_a_layout_at_the_edge_of_each_rule_passes(layout, spec, batch):
    layout.validate(spec, batch)


def test_ranks_lie_on_the_grid_tensor_parallel_innermost():
    layout = Layout(dp=2, tp=2, pp=2, micro_batches=2)
    assert [tuple(layout.coordinates(r)[d] for d in ("pp", "dp", "tp")) for r in range(8)] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    assert layout.devices == 8 and layout.splits_model and not Layout(dp=8).splits_model
    assert Layout(tp=2).splits_model and Layout(pp=2, micro_batches=2).splits_model
    assert Layout(pp=4, micro_batches=12).bubble() == pytest.approx(3 / 15) and Layout().bubble() == 0.0
    assert [Layout(pp=2).stage_of_layer(i, 5) for i in range(5)] == [0, 0, 0, 1, 1]
    assert [Layout(pp=3).stage_of_layer(i, 4) for i in range(4)] == [0, 1, 2, 2]  # (4 + 1) // 3 = 1 a stage
    assert Layout(pp=2, stage_split="3,1").stage_layers(1, MINI, 8) == [3]
    assert Layout(pp=2).stage_layers(0, MINI, 8) == [0, 1]
    assert Layout(dp=2).accumulation(3) == 3 and Layout(pp=2, micro_batches=4).accumulation(2) == 8


def test_what_each_rank_holds_in_words():
    layout = Layout(fsdp=2, tp=2, pp=2, micro_batches=2, vocab_split=True)
    assert layout.holds(0, MINI, 4) == "embeddings + layers 0-1, heads, FFN and vocabulary shard 1/2, parameters " \
                                       "and optimizer state shard 1/2"
    assert layout.holds(7, MINI, 4) == "layers 2-3 + MLM head, heads, FFN and vocabulary shard 2/2, parameters " \
                                       "and optimizer state shard 2/2"
    assert Layout().holds(0, TINY, 4) == "embeddings + layers 0-1 + MLM head"
    assert Layout(tp=2).holds(1, TINY, 4) == "embeddings + layers 0-1 + MLM head, heads, FFN shard 2/2"
    assert Layout(dp=2, tp=2).holds(3, CNN, 4) == "the whole CNN, fc0/fc1 shard 2/2"


def test_the_record_of_a_layout_and_back():
    layout = Layout(dp=2, pp=2, micro_batches=4, stage_split="3,1")
    record = layout.as_record(MINI, 16)
    assert record["layers_per_stage"] == [3, 1] and record["dp"] == 2 and record["stage_split"] == "3,1"
    assert record["per_rank"][3] == {"rank": 3, "dp": 1, "fsdp": 0, "tp": 0, "pp": 1, "holds": "layers 3-3 + MLM head"}
    assert len(record["per_rank"]) == 4 and Layout.from_record(record) == layout
    assert "layers_per_stage" not in Layout(dp=2).as_record(CNN, 8)
    # a replica's samples are whole (5 // 3 = 1): base's 12 layers over 4 stages placed for 1 sample, where 5 / 3
    # would weigh the compute more against the optimizer's and move a layer (to 3, 3, 4, 2)
    auto = Layout(dp=3, pp=4, micro_batches=4, stage_split="auto")
    assert auto.as_record(BERT_SIZES["base"], 5)["layers_per_stage"] == [2, 4, 4, 2]
    assert auto.placed(BERT_SIZES["base"], 5).stage_split == "2,4,4,2"
    assert Layout.from_record({"dp": 3, "unknown": 1}) == Layout(dp=3)
    # a record written before the one layout type reads as it meant
    assert Layout.from_record({"dp": 2, "tp": 2, "optimizer_shard": True, "recompute": True, "vocab_emb_dp": False}) \
        == Layout(fsdp=2, tp=2, recompute="full", vocab_split=True)
    assert Layout.from_record({"dp": 2, "optimizer_shard": False, "recompute": False, "vocab_emb_dp": True}) \
        == Layout(dp=2)
    assert Layout.for_devices(8, tp=2, pp=2, micro_batches=2) == Layout(dp=2, tp=2, pp=2, micro_batches=2)
    with pytest.raises(BadInput, match="^6 devices are not divisible by model parallel 2 x pipeline stages 2$"):
        Layout.for_devices(6, tp=2, pp=2)
    assert Layout.for_devices(8, fsdp=2, tp=2) == Layout(dp=2, fsdp=2, tp=2)   # the replicas take the rest: HSDP
    with pytest.raises(BadInput, match="^6 devices are not divisible by fsdp 4 x model parallel 1 x pipeline "
                                       "stages 1 x context parallel 2$"):
        Layout.for_devices(6, fsdp=4, cp=2)


def test_flags_as_the_user_types_them():
    layout = Layout(fsdp=2, tp=2, pp=2, micro_batches=4, schedule="1f1b", recompute="full",
                    vocab_split=True, stage_split="3,1")
    assert layout.non_default_flags() == ["--fsdp 2", "--model-parallel 2", "--pipeline-stages 2",
                                          "--micro-batches 4", "--pipeline-schedule 1f1b", "--recompute full",
                                          "--vocab-split", "--stage-split 3,1"]
    assert layout.run_flags()[:4] == ["--fsdp", "2", "--model-parallel", "2"]
    assert Layout(dp=8).non_default_flags() == [] and OPTION["recompute"].flag_for("none") == ""
    assert OPTION["vocab_split"].flag_for(False) == "" and OPTION["stage_split"].word_for("3,1") == "split3+1"
    assert OPTION["tp"].is_count and not OPTION["recompute"].is_count and not OPTION["schedule"].is_count
    executed_by = {"tp": ["torch_3d", "keras_jax"], "pp": ["torch_3d"]}
    refuse_layout(Layout(dp=4), "torch_ddp", frozenset(), executed_by)
    with pytest.raises(Unsupported, match="^--model-parallel 2: torch_ddp is data parallel only; keras_jax, torch_3d "
                                          "run layouts$"):
        refuse_layout(Layout(tp=2), "torch_ddp", frozenset(), executed_by)
    with pytest.raises(Unsupported, match="^--pipeline-stages 2: keras_jax does not execute it; torch_3d does$"):
        refuse_layout(Layout(tp=2, pp=2, micro_batches=2), "keras_jax", frozenset({"tp"}), executed_by)
    with pytest.raises(Unsupported, match="^--sequence-parallel: torch_3d does not execute it; no backend here does"):
        refuse_layout(Layout(tp=2, sp=True), "torch_3d", frozenset({"tp", "pp"}), executed_by)
    # the registry's: ZeRO-2 is torch_3d's (FSDP2), not keras_jax's
    with pytest.raises(Unsupported, match="^--zero2: keras_jax does not execute it; torch_3d does$"):
        refuse_layout(Layout(fsdp=2, zero2=True), "keras_jax", BACKENDS["keras_jax"].layouts, EXECUTED_BY)
    refuse_layout(Layout(tp=2, pp=2, micro_batches=2), "torch_3d", frozenset({"tp", "pp", "micro_batches"}),
                  executed_by)
    with pytest.raises(Unsupported, match="^--model-parallel 2: torch_ddp does not execute it; torch_3d, keras_jax "
                                          "do$"):   # two backends that do: "do", each named once
        refuse_layout(Layout(tp=2), "torch_ddp", frozenset({"pp"}), executed_by)
    assert cnn_layers(CNN) == 4 + 2 + 1


@pytest.mark.parametrize("layout, name", [
    (Layout(), "1 device"), (Layout(dp=4), "dp4"), (Layout(fsdp=4), "fsdp4"), (Layout(dp=2, fsdp=4), "dp2xfsdp4"),
    (Layout(fsdp=2, tp=2), "fsdp2xtp2"), (Layout(tp=2, vocab_split=True), "tp2-vocab"),
    (Layout(pp=2, micro_batches=4), "pp2-nmb4"), (Layout(pp=2, micro_batches=2, schedule="1f1b", recompute="full",
                                                        stage_split="auto"), "pp2-nmb2-1f1b-rc-splitauto"),
    (Layout(micro_batches=3), "1 device-nmb3"), (Layout(fsdp=2, micro_batch_size=2), "fsdp2-mbs2"),
    (Layout(dp=2, fsdp=2, recompute="full", zero2=True), "dp2xfsdp2-rc-zero2"),
    (Layout(tp=2, pp=2, micro_batches=4, schedule="interleaved", virtual_stages=2, sp=True, tp_overlap=True),
     "tp2xpp2-nmb4-vp2-sp-tpo"),
])
def test_the_canonical_name_and_back(layout, name):
    assert layout.name == name
    assert "cp2" in replace(layout, cp=2).name     # a copy names itself, not the layout it was made from
    if not name.startswith("1 device"):
        assert Layout.parse(name) == layout


@pytest.mark.parametrize("entry, reason", [
    ("dp2xdp2", "'dp2xdp2': the dp dimension is given twice"),
    ("dp2xfsdp2xdp4", "'dp2xfsdp2xdp4': the dp dimension is given twice"),
    ("dp02", "'dp02': dp size must be an integer >= 2 without leading zeros, got 02"),
    ("tp1", "'tp1': tp size must be an integer >= 2 without leading zeros, got 1"),
    ("pp2-nmb0", "'pp2-nmb0': nmb must be an integer >= 1 without leading zeros, got 0"),
    ("pp2-nmb2-nmb4", "'pp2-nmb2-nmb4': 'nmb4' repeats an option already given"),
    ("dp2-vocab", "'dp2-vocab': 'vocab' needs tensor parallelism (tp<N>)"),
    ("dp2-1f1b", "'dp2-1f1b': '1f1b' needs a pipeline (pp<N>)"),
    ("pp2-split9", "'pp2-split9': 'split9': "),
    ("ep2", "'ep2': expert parallelism is not modelled"),
    ("zz2", "'zz2': 'zz2' is not dp<N>, fsdp<N>, tp<N>, pp<N> or cp<N>"),
    ("dp", "'dp': a bare dp takes the devices the others leave: it needs a device count"),
    ("dp2-fast", "'dp2-fast': unknown option 'fast'; choose from nmb<K>, mbs<K>, 1f1b, gpipe, vp<K>, rc, sel, sp, "
                 "zero1, zero2, tpo, vocab, split<VALUE>"),
])
def test_a_bad_name_says_why(entry, reason):
    with pytest.raises(ValueError) as err:
        Layout.parse(entry)
    assert str(err.value).startswith(reason)


def test_the_edges_a_first_pass_of_mutation_testing_found():
    """Each a mutant the tests above let through: a size of 0 on any axis, the hidden and intermediate sizes named,
    the fc layer that is split, --grad-accum without a pipeline, a layout built with no tp or pp given, and an
    auto split that weighs the samples."""
    for layout, axis in ((Layout(tp=0), "model 0"), (Layout(pp=0), "pipeline 0")):
        with pytest.raises(BadInput, match=axis):
            layout.validate(TINY, 8)
    odd = BertSpec("odd", layers=2, hidden=5, heads=2, intermediate=6, seq_len=2, vocab_size=10)
    with pytest.raises(BadInput, match="^hidden size 5 is not divisible by model parallel 2$"):
        Layout(tp=2).validate(odd, 8)
    with pytest.raises(BadInput, match="^intermediate size 6 is not divisible by model parallel 4$"):
        Layout(tp=4).validate(BertSpec("odd", layers=2, hidden=8, heads=4, intermediate=6, seq_len=2,
                                       vocab_size=10), 8)
    Layout(tp=256).validate(CNN, 8)  # fc0 (1024) splits over 256; fc1 (128) is not split
    Layout(dp=2).validate(TINY, 8, grad_accum=2)
    assert Layout.for_devices(4) == Layout(dp=4) and Layout.for_devices(4).name == "dp4"
    assert Layout.for_devices(8, tp=2).name == "dp4xtp2" and Layout.for_devices(4, pp=2, micro_batches=2).name == \
        "dp2xpp2-nmb2"
    auto = Layout(pp=2, micro_batches=2, stage_split="auto")
    assert auto.holds(1, MINI, 8) == "layers 3-3 + MLM head"   # mini's balanced split: 3 + 1 (tests/test_stage_split)
    assert auto.as_record(MINI, 8)["layers_per_stage"] == [3, 1]
    assert auto.as_record(MINI, 8)["per_rank"][1]["holds"] == "layers 3-3 + MLM head"


@pytest.mark.parametrize("layout, asked", [
    (Layout(fsdp=2), [("fsdp", "--fsdp 2")]),                       # shards alone: FSDP
    (Layout(fsdp=2, zero2=True), [("fsdp", "--fsdp 2"), ("zero2", "--zero2")]),
    (Layout(dp=2, fsdp=2), [("hsdp", "--fsdp 2")]),                 # shards under replicas: HSDP, never both
    (Layout(cp=2), [("cp", "--context-parallel 2")]),
    (Layout(pp=2, micro_batches=2), [("pp", "--pipeline-stages 2"), ("micro_batches", "--micro-batches 2")]),
    (Layout(micro_batch_size=1), [("micro_batch_size", "--micro-batch-size 1")]),
    (Layout(pp=2, micro_batches=2, schedule="interleaved", virtual_stages=2),
     [("pp", "--pipeline-stages 2"), ("micro_batches", "--micro-batches 2"),
      ("interleaved", "--pipeline-schedule interleaved")]),
    # either half of interleaving asks for it (validate refuses the half alone); with no flag, by its own name
    (Layout(pp=2, schedule="interleaved"), [("pp", "--pipeline-stages 2"),
                                            ("interleaved", "--pipeline-schedule interleaved")]),
    (Layout(pp=2, virtual_stages=2), [("pp", "--pipeline-stages 2"), ("interleaved", "--interleaved")]),
    (Layout(pp=2, micro_batches=2, schedule="1f1b"),
     [("pp", "--pipeline-stages 2"), ("micro_batches", "--micro-batches 2"), ("1f1b", "--pipeline-schedule 1f1b")]),
    (Layout(recompute="selective"), [("selective", "--recompute selective")]),
    (Layout(recompute="full"), [("recompute", "--recompute full")]),
    (Layout(tp=2, sp=True, zero1=True, tp_overlap=True, vocab_split=True),
     [("tp", "--model-parallel 2"), ("sp", "--sequence-parallel"), ("zero1", "--zero1"),
      ("tp_overlap", "--tp-overlap"), ("vocab_split", "--vocab-split")]),
    (Layout(pp=2, stage_split="auto"), [("pp", "--pipeline-stages 2"), ("stage_split", "--stage-split auto")]),
    (Layout(dp=8), []),
])
def test_what_a_layout_asks_of_a_backend_at_size_two(layout, asked):
    """Each feature at the smallest size that asks it (2), in FEATURES' order, with the flag a refusal names."""
    assert layout.features() == asked


def test_a_switch_on_by_default_is_turned_off_by_its_no_flag_and_has_no_word():
    """No option in OPTIONS is on by default today; LayoutOption says how one would be typed and named."""
    on = LayoutOption("overlap", "--overlap", "overlap the collectives", True, token="ovl")
    assert on.flag_for(False) == "--no-overlap" and on.flag_for(True) == ""
    assert on.word_for(False) == "" and on.word_for(True) == ""
    assert OPTION["sp"].word_for(True) == "sp" and OPTION["sp"].word_for(False) == ""
    # a choice without a word of its own (interleaved: its vp<V> says it) is no word, not None
    assert OPTION["schedule"].word_for("interleaved") == "" and OPTION["schedule"].word_for("1f1b") == "1f1b"
    assert OPTION["recompute"].word_for("selective") == "sel" and OPTION["recompute"].word_for("none") == ""


def test_micro_batches_of_a_given_size_are_whole():
    """The batch over data ranks x the size, rounded down: 8 samples in micro-batches of 3 are 2 of them."""
    assert Layout(micro_batch_size=3).micro_batches_at(8) == 2
    assert repr(Layout(dp=2, micro_batch_size=2).micro_batches_at(16)) == "4"
    assert Layout(pp=2, micro_batches=6).micro_batches_at(1000) == 6


@pytest.mark.parametrize("entry, devices, reason", [
    ("dpxfsdp", 8, "'dpxfsdp': only one bare dp or fsdp may take the devices left"),
    ("tp", 8, "'tp': only one bare dp or fsdp may take the devices left"),
    ("dp", None, "'dp': a bare dp takes the devices the others leave: it needs a device count (bench.predict and "
                 "bench.plan give one; a sweep's layouts give sizes)"),
    ("pp2-nmb2-nmb4", None, "'pp2-nmb2-nmb4': 'nmb4' repeats an option already given or contradicts one"),
    ("pp2-vp2-gpipe", None, "'pp2-vp2-gpipe': 'gpipe' repeats an option already given or contradicts one"),
    ("tp2-tpo-tpo", None, "'tp2-tpo-tpo': 'tpo' repeats an option already given or contradicts one"),
    ("pp2-gpipe-vp2", None, "'pp2-gpipe-vp2': vp<V> is interleaved 1F1B; it cannot be combined with gpipe"),
    ("pp2-mbs2-nmb4", None, "'pp2-mbs2-nmb4': give the number of micro-batches (nmb<K>) or their size (mbs<B>), "
                            "not both"),
    ("pp2-nmb2-mbs2", None, "'pp2-nmb2-mbs2': give the number of micro-batches (nmb<K>) or their size (mbs<B>), "
                            "not both"),
    ("cp2-sp", None, "'cp2-sp': 'sp' needs tensor parallelism (tp<N>)"),
    ("pp2-split9", None, "'pp2-split9': 'split9': '9' is not even, auto or layers per stage (e.g. 3,1), each >= 1"),
    ("tp2-fp8", None, "'tp2-fp8': fp8 is the software's, not the layout's: a stack that trains in float8 says "
                      "it (bench.predict --stack torch-compile-float8, torchao's Float8 training)"),
    ("ep4", None, "'ep4': expert parallelism is not modelled: the bundled models are dense"),
    ("dp8-zero2", None, "'dp8-zero2': 'zero2' needs FSDP shards (fsdp<N>)"),
    ("dp-zero2", 8, "'dp-zero2': 'zero2' needs FSDP shards (fsdp<N>)"),
])
def test_a_name_the_grammar_refuses_says_why_in_full(entry, devices, reason):
    with pytest.raises(Refused) as err:
        Layout.parse(entry, devices)
    assert str(err.value) == reason
    if "it needs a device count" in reason:   # a bare dp is a good name once a count is given
        check_name(entry)
        return
    with pytest.raises(Refused, match="^" + re.escape(reason.split(":")[0])):   # whatever the device count
        check_name(entry)


@pytest.mark.parametrize("entry, devices, reason", [
    ("tp3", 4, "'tp3' at 4 devices: the other dimensions (3) do not divide them"),
    ("dp2xtp2", 8, "'dp2xtp2' uses 4 devices, not 8"),
    ("tp2xfsdp2", 8, "'tp2xfsdp2' uses 4 devices, not 8"),   # a sized data dimension takes no more
])
def test_a_name_that_cannot_fill_the_devices_is_the_device_counts_objection_not_the_names(entry, devices, reason):
    with pytest.raises(ValueError) as err:
        Layout.parse(entry, devices)
    assert str(err.value) == reason and not isinstance(err.value, Refused)
    check_name(entry)   # the name itself is good


@pytest.mark.parametrize("entry, devices, name", [
    ("dp", 8, "dp8"), ("fsdpxtp2", 8, "fsdp4xtp2"), ("tp2", 8, "dp4xtp2"), ("tp2", 2, "tp2"),
    ("pp2-vp2-1f1b", None, "pp2-nmb4-vp2"), ("pp2-1f1b-vp2", None, "pp2-nmb4-vp2"),  # vp<V> is interleaved 1F1B
    ("pp2-mbs2", None, "pp2-mbs2"), ("pp3", None, "pp3-nmb6"),
    ("fsdp-zero2", 8, "fsdp8-zero2"), ("fsdpxtp2-zero2-rc", 8, "fsdp4xtp2-rc-zero2"),   # the bare fsdp is FSDP's
])
def test_a_name_at_a_device_count(entry, devices, name):
    assert Layout.parse(entry, devices).name == name


def _decoder(**changes):
    from dataclasses import replace

    from common.predict.decoder import DecoderSpec
    toy = DecoderSpec("toy-lm", layers=2, hidden=4, heads=2, kv_heads=1, ffn=8, ffn_kind="swiglu", vocab=10,
                      seq_len=2, tied_embeddings=False)
    return replace(toy, **changes)


@pytest.mark.parametrize("layout, changes, message", [
    (Layout(tp=3), {}, "tp3: toy-lm's 2 heads and FFN 8 must divide by tp 3"),
    (Layout(tp=4), {"heads": 4, "ffn": 6}, "tp4: toy-lm's 4 heads and FFN 6 must divide by tp 4"),
    (Layout(tp=4), {"heads": 4, "kv_heads": 3}, "tp4: 3 key/value heads cannot be split or replicated over tp 4"),
    (Layout(tp=4, vocab_split=True), {"heads": 4}, "tp4-vocab: vocabulary 10 is not divisible by tp 4"),
    (Layout(pp=4, micro_batches=4), {}, "pp4-nmb4: 2 layers cannot fill 4 pipeline chunks"),
    (Layout(pp=2, micro_batches=2, schedule="interleaved", virtual_stages=2), {},
     "pp2-nmb2-vp2: 2 layers cannot fill 4 pipeline chunks"),
    (Layout(pp=2, micro_batches=2, stage_split="1,1"), {},
     "pp2-nmb2-split1+1: --stage-split 1,1: a decoder's layers are split evenly over its pipeline chunks"),
    (Layout(cp=2), {}, "cp2: sequence 2 must split into 2 x cp 2 chunks"),
])
def test_a_decoder_layout_that_cannot_be_laid_out_is_named(layout, changes, message):
    with pytest.raises(BadInput) as err:
        layout.validate(_decoder(**changes), 8)
    assert str(err.value) == message


@pytest.mark.parametrize("layout, changes", [
    (Layout(tp=2), {}),                                   # one key/value head replicated over tp 2
    (Layout(tp=4), {"heads": 4, "kv_heads": 2}),          # two, each on two ranks
    (Layout(tp=2), {"heads": 4, "kv_heads": 4}),          # four split two a rank
    (Layout(tp=2, vocab_split=True), {}), (Layout(pp=2, micro_batches=2), {}), (Layout(cp=1), {}),
    (Layout(micro_batch_size=2), {}), (Layout(micro_batches=2), {}),   # the decoders' model takes either alone
])
def test_a_decoder_layout_at_the_edge_of_each_rule_passes(layout, changes):
    layout.validate(_decoder(**changes), 8)


@pytest.mark.parametrize("layout, name", [
    (Layout(dp=2, zero1=True), "dp2-zero1"), (Layout(dp=2, recompute="full", zero1=True), "dp2-rc-zero1"),
    # a word whose dimension is missing says nothing (validate refuses it), and the words after it still speak
    (Layout(sp=True, zero1=True), "1 device-zero1"),
    (Layout(pp=2, micro_batch_size=2), "pp2-mbs2"),   # the size given: no nmb<K>
    (Layout(pp=2, micro_batches=4, schedule="interleaved", virtual_stages=2, stage_split="3,1"),
     "pp2-nmb4-vp2-split3+1"),
    (Layout(cp=2, recompute="selective"), "cp2-sel"), (Layout(tp=2, sp=True, tp_overlap=True, vocab_split=True),
                                                       "tp2-sp-tpo-vocab"),
    (Layout(dp=2, fsdp=2, tp=2, pp=2, cp=2, micro_batches=2), "dp2xfsdp2xtp2xpp2xcp2-nmb2"),
])
def test_names_in_name_order(layout, name):
    assert layout.name == name


def test_what_each_rank_of_a_decoder_holds_in_words():
    pp2 = Layout(pp=2, micro_batches=2)
    assert pp2.holds(0, _decoder(), 4) == "embeddings + layers 0-0"
    assert pp2.holds(1, _decoder(), 4) == "layers 1-1 + norm + output layer"
    assert Layout(fsdp=2, tp=2, vocab_split=True).holds(3, _decoder(), 4) == \
        "embeddings + layers 0-1 + norm + output layer, heads, FFN and vocabulary shard 2/2, parameters and " \
        "optimizer state shard 2/2"
    assert pp2.as_record(_decoder(), 8)["layers_per_stage"] == [1, 1]


def test_a_layout_accumulates_its_micro_batches_once_without_grad_accum():
    assert Layout(pp=2, micro_batches=4).accumulation() == 4 and Layout().accumulation() == 1


def test_the_cnn_and_a_short_sequence_refuse_in_their_own_words():
    with pytest.raises(BadInput) as err:
        Layout(micro_batch_size=2).validate(CNN, 8)
    assert str(err.value) == ("--micro-batch-size 2: the CNN's runs take the number of micro-batches "
                              "(--micro-batches); their size follows from --batch-size")
    six = BertSpec("six", layers=2, hidden=8, heads=2, intermediate=8, seq_len=6, vocab_size=10)
    with pytest.raises(BadInput, match=r"^sequence 6 does not split into 2 x context parallel 2 chunks$"):
        Layout(cp=2).validate(six, 8)   # 6 tokens in 4 chunks: no
    Layout(cp=3).validate(six, 6)       # in 6: one each


def test_an_auto_split_is_placed_at_the_samples_of_one_pipeline():
    """base BERT in 5 stages balances as 2, 3, 3, 3, 1 at 2 sequences a pipeline, as 2, 2, 3, 3, 2 from 4; a batch
    of 8 over 4 replicas is 2 a pipeline; a given split is kept."""
    base = BERT_SIZES["base"]
    auto = Layout(pp=5, micro_batches=5, stage_split="auto")
    assert auto.placed(base, 8).stage_split == "2,2,3,3,2"
    assert replace(auto, dp=4).placed(base, 8).stage_split == "2,3,3,3,1"
    given = Layout(pp=2, micro_batches=2, stage_split="3,1")
    assert given.placed(MINI, 8) is given and Layout(pp=2, micro_batches=2).placed(MINI, 8).stage_split == "even"
    assert [Layout(dp=2, fsdp=2).coordinates(r)["data"] for r in range(4)] == [0, 1, 2, 3]
