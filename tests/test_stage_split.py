"""common.stage_split: per-stage costs by hand, the balanced split, and --stage-split as a layout option."""
from __future__ import annotations

import pytest

from common.errors import BadInput
from common.layout import Layout
from common.spec import BERT_SIZES, BertSpec
from common.stage_split import OPTIMIZER_FLOPS_PER_PARAM, balanced_split, parse_split, stage_costs, tied_table

# h 2, intermediate 4, 2 positions, vocabulary 10: small enough to count by hand.
TOY = BertSpec("toy", layers=3, hidden=2, heads=1, intermediate=4, seq_len=2, vocab_size=10)


def test_the_toy_parts_counted_by_hand():
    # Q, K, V, O (4 x (2x2 + 2)), LayerNorm 2 x 2, FFN 2x4 + 4 and 4x2 + 2, LayerNorm 2 x 2
    assert TOY.layer_params() == 24 + 4 + 12 + 10 + 4 == 54
    assert TOY.embedding_params() == (10 + 2 + 2) * 2 + 4 == 32
    assert TOY.head_params() == (4 + 2) + 4 + 10 == 20
    # per sequence: 4 s h^2 + 2 s^2 h + 2 s h i; the head at ceil(0.15 x 2) = 1 position: h^2 + h V
    assert TOY.layer_forward_macs() == 32 + 16 + 32 == 80
    assert TOY.head_forward_macs() == 4 + 20 == 24
    assert TOY.param_count() == 32 + 3 * 54 + 20


def test_stage_costs_by_hand():
    assert OPTIMIZER_FLOPS_PER_PARAM == 500
    samples = 3  # forward+backward of a part: 6 x its multiply-adds x 3 sequences = 18 x its MACs
    first = 18 * 2 * 80 + 500 * 2 * 54 + 500 * 32          # two layers and the embeddings
    last = 18 * 80 + 500 * 54 + 18 * 24 + 500 * (20 + 20)  # a layer, the head and its copy of the 10 x 2 table
    assert stage_costs(TOY, [2, 1], samples) == [first, last] == [72880, 48872]
    assert stage_costs(TOY, [1, 2], samples) == [44440, 77312]


def test_the_split_balances_the_costliest_stage():
    assert balanced_split(TOY, 2, 3) == [2, 1]  # max 72880 against [1, 2]'s 77312
    # mini BERT: the head and the tied table weigh about 1.6 layers: three layers before them
    assert balanced_split(BERT_SIZES["mini"], 2, 128) == [3, 1]
    # base BERT: the head is half a layer; 6 + 6 + head beats 7 against 5 + head
    assert balanced_split(BERT_SIZES["base"], 2, 128) == [6, 6]
    # Among splits whose costliest stage costs the same, the nearest to even by squared distance, the first cut
    # on a tie: mini in 3, the head's stage takes one layer; [1, 2, 1] and [2, 1, 1] are both 6/9 from 4/3 each
    assert balanced_split(BERT_SIZES["mini"], 3, 128) == [1, 2, 1]
    # base in 5: [2, 2, 3, 3, 2] (1.2 from 2.4 each) before [2, 3, 3, 3, 1] (3.2), whose costliest stage is as costly
    assert balanced_split(BERT_SIZES["base"], 5, 32) == [2, 2, 3, 3, 2]
    # base in 11: which of the placements of the one 2-layer stage is nearest to even is, in exact arithmetic, a
    # tie; the floating-point sums of squares break it, and any change to the distance (its centre, its power)
    # moves the pick: pinned so that such a change shows
    assert balanced_split(BERT_SIZES["base"], 11, 4) == [1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1]
    assert balanced_split(BERT_SIZES["tiny"], 2, 128) == [1, 1]  # two layers leave no choice


@pytest.mark.parametrize("text, canonical", [("auto", "auto"), ("EVEN", "even"), ("3,1", "3,1"), ("1+3", "1,3")])
def test_split_values(text, canonical):
    assert parse_split(text) == canonical


@pytest.mark.parametrize("text", ["3", "0,4", "a,b", "01,3", "balanced", ""])
def test_bad_split_values(text):
    with pytest.raises(ValueError, match="layers per stage"):
        parse_split(text)


def test_the_layout_places_layers_by_the_split_and_names_it():
    mini = BERT_SIZES["mini"]
    lay = Layout(pp=2, micro_batches=4, schedule="1f1b", stage_split="auto")
    assert lay.name == "pp2-nmb4-1f1b-splitauto" and Layout.parse(lay.name) == lay
    assert lay.stage_layers(0, mini, 128) == [0, 1, 2] and lay.stage_layers(1, mini, 128) == [3]
    assert lay.run_flags()[-2:] == ["--stage-split", "auto"]
    given = Layout.parse("pp2-nmb4-split1+3")
    assert given.stage_split == "1,3" and given.name == "pp2-nmb4-split1+3"
    assert given.stage_layers(1, mini, 128) == [1, 2, 3]
    record = given.as_record(mini, 128)
    assert record["layers_per_stage"] == [1, 3] and record["per_rank"][1]["holds"] == "layers 1-3 + MLM head"
    even = Layout(pp=2, micro_batches=4)
    assert even.stage_layers(0, mini, 128) == [0, 1] and "split" not in even.name
    assert [even.stage_of_layer(i, 4) for i in range(4)] == [0, 0, 1, 1]


@pytest.mark.parametrize("layout, message", [
    (Layout(stage_split="auto"), "1 pipeline stage"),
    (Layout(pp=2, micro_batches=2, stage_split="1,1,2"), "2 counts that add up to 4"),
    (Layout(pp=2, micro_batches=2, stage_split="1,2"), "2 counts that add up to 4"),
])
def test_a_split_that_cannot_be_laid_out_is_bad_input(layout, message):
    with pytest.raises(BadInput, match=message):
        layout.validate(BERT_SIZES["mini"], 8)


def test_a_split_name_without_a_pipeline_is_refused():
    with pytest.raises(ValueError, match="needs a pipeline"):
        Layout.parse("tp2-splitauto")
    with pytest.raises(ValueError, match="layers per stage"):
        Layout.parse("pp2-split3")


def test_the_edges_a_first_pass_of_mutation_testing_found():
    """One stage holds no second copy of the token table; with three stages the head is on the third; between two
    splits of the same costliest stage the one nearest to even is taken."""
    samples = 3
    whole = 18 * (3 * 80 + 24) + 500 * (32 + 3 * 54 + 20)
    assert stage_costs(TOY, [3], samples) == [whole]
    assert stage_costs(TOY, [1, 1, 1], samples) == [18 * 80 + 500 * (54 + 32), 18 * 80 + 500 * 54,
                                                    18 * (80 + 24) + 500 * (54 + 20 + 20)]
    # 5 thin layers under a 1000-word table, parameters only: [2, 2, 1] and [1, 3, 1] tie on the last stage
    thin = BertSpec("thin", layers=5, hidden=2, heads=1, intermediate=8, seq_len=4, vocab_size=1000)
    assert max(stage_costs(thin, [2, 2, 1], 0)) == max(stage_costs(thin, [1, 3, 1], 0))
    assert balanced_split(thin, 3, 0) == [2, 2, 1]


def test_a_decoders_stage_costs_and_its_tied_table_by_hand():
    """The toy decoder LM (tests/test_predict_memory.py's): a layer 304 multiply-adds a sequence and 152 parameters,
    the 10 x 4 token table, the output layer 80 multiply-adds and, untied, 4 + 40 parameters. Only a tied decoder's
    last stage holds a copy of the table; an untied one's output layer is its head's own."""
    from dataclasses import replace

    from tests.test_predict_memory import DECODER
    tied = replace(DECODER, tied_embeddings=True)
    assert tied_table(DECODER) == 0 and tied_table(tied) == 10 * 4
    assert stage_costs(DECODER, [1, 1], 1) == [6 * 304 + 500 * (152 + 40), 6 * (304 + 80) + 500 * (152 + 44)]
    assert stage_costs(tied, [1, 1], 1) == [6 * 304 + 500 * (152 + 40), 6 * (304 + 80) + 500 * (152 + 4 + 40)]
    assert stage_costs(tied, [2], 1) == [6 * (2 * 304 + 80) + 500 * (40 + 2 * 152 + 4)]   # one stage: no copy
