"""common.predict.work: each rank's share of the model's multiply-adds under a layout, counted by hand on a toy
BERT (tests/test_stage_split.py's) and on the CNN."""
from __future__ import annotations

import pytest

from common.layout import Layout
from common.predict.work import Parts, parts, stage_layer_counts, stage_macs
from common.spec import CNN, BertSpec

# h 2, intermediate 4, 2 positions, vocabulary 10; 1 masked position a sequence (ceil(0.15 x 2)).
TOY = BertSpec("toy", layers=3, hidden=2, heads=1, intermediate=4, seq_len=2, vocab_size=10)
LAYER, HEAD_DENSE, HEAD_VOCAB = 4 * 2 * 4 + 2 * 4 * 2 + 2 * 2 * 2 * 4, 1 * 2 * 2, 1 * 2 * 10  # 80, 4, 20


def test_the_parts_of_a_bert_counted_by_hand():
    assert parts(TOY) == Parts(layer=LAYER, layers=3, head_dense=HEAD_DENSE, head_vocab=HEAD_VOCAB)
    assert parts(TOY).total == 3 * 80 + 4 + 20 == TOY.forward_macs()
    assert all(isinstance(v, float) for v in (parts(TOY).layer, parts(TOY).head_dense, parts(TOY).head_vocab))


def test_the_cnn_is_one_part_of_its_whole_forward():
    cnn = parts(CNN)
    assert cnn == Parts(layer=CNN.forward_macs(), layers=1, head_dense=0.0, head_vocab=0.0)
    assert cnn.total == CNN.forward_macs() > 1e7  # convolutions and fully connected layers: millions a sample
    assert stage_macs(CNN, Layout(fsdp=4)) == [CNN.forward_macs()]
    for split in (Layout(tp=2), Layout(pp=2, micro_batches=2)):
        with pytest.raises(ValueError, match=r"^the model predicts the CNN data parallel only \(dp, fsdp\)$"):
            stage_macs(CNN, split)


def test_layers_per_stage_even_recorded_or_asked_for():
    assert stage_layer_counts(Layout(), 3) == [3]
    # the even split: (3 + 1) // 2 = 2 layers a stage, the last stage what is left (common.stage_split.even_split)
    assert stage_layer_counts(Layout(pp=2, micro_batches=2), 3) == [2, 1]
    assert stage_layer_counts(Layout(pp=3, micro_batches=3), 3) == [1, 1, 1]
    assert stage_layer_counts(Layout(pp=2, micro_batches=2, stage_split="2,1"), 3) == [2, 1]
    assert stage_layer_counts(Layout(pp=2, micro_batches=2, stage_split="1,2"), 3) == [1, 2]  # not the even one
    with pytest.raises(ValueError, match=r"stage_split \[2, 2\] does not cut 3 layers into 2 stages"):
        stage_layer_counts(Layout(pp=2, micro_batches=2, stage_split="2,2"), 3)
    with pytest.raises(ValueError, match=r"stage_split \[3\] does not cut 3 layers into 2 stages"):
        stage_layer_counts(Layout(pp=2, micro_batches=2, stage_split="3"), 3)
    with pytest.raises(ValueError, match="--stage-split auto: placed by Layout.placed before it is predicted"):
        stage_layer_counts(Layout(pp=2, micro_batches=2, stage_split="auto"), 3)


def test_a_stage_s_share_by_hand():
    assert stage_macs(TOY, Layout()) == [3 * LAYER + HEAD_DENSE + HEAD_VOCAB]
    # tp splits the layers; the head's dense transform stays whole, the decoder too while the vocabulary is not split
    assert stage_macs(TOY, Layout(tp=2)) == [3 * LAYER / 2 + HEAD_DENSE + HEAD_VOCAB]
    assert stage_macs(TOY, Layout(tp=2, vocab_split=True)) == [3 * LAYER / 2 + HEAD_DENSE + HEAD_VOCAB / 2]
    # pp: the head on the last stage only
    assert stage_macs(TOY, Layout(pp=2, micro_batches=2)) == [2 * LAYER, LAYER + HEAD_DENSE + HEAD_VOCAB]
    one_two = Layout(pp=2, micro_batches=2, stage_split="1,2")
    assert stage_macs(TOY, one_two) == [LAYER, 2 * LAYER + HEAD_DENSE + HEAD_VOCAB]
    assert stage_macs(TOY, Layout(dp=4)) == stage_macs(TOY, Layout())  # dp divides the samples, not a sample


def test_what_recompute_runs_again():
    """--recompute runs each encoder layer's forward again, never the head; no backend recomputes the CNN; and
    without --recompute nothing runs twice."""
    rc = Layout(recompute="full")
    assert stage_macs(TOY, rc, recomputed=True) == [3 * LAYER]
    assert stage_macs(TOY, Layout(pp=2, micro_batches=2, recompute="full"), True) == [2 * LAYER, LAYER]
    assert stage_macs(TOY, Layout(pp=2, micro_batches=2), True) == [0.0, 0.0]
    assert stage_macs(CNN, rc, recomputed=True) == [0.0] == stage_macs(CNN, Layout(dp=2), recomputed=True)
    assert stage_macs(CNN, rc) == [CNN.forward_macs()]
