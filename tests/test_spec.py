"""The spec's formulas against the models and against counts worked out by hand."""
from __future__ import annotations

import pytest
import torch

from backends.torch_common.models import build_model, param_count
from common.spec import BERT_SIZES, CNN, DEFAULTS, WORKLOADS, OptimSpec, learning_rate, training_flops_per_sample


def test_cnn_matches_conventions():
    assert CNN.param_count() == 2_328_298
    assert CNN.flat_features == 2048  # 28 -> 26 -> 24 -> 12 -> 10 -> 8 -> 4; 128 * 4 * 4
    assert param_count(build_model("cnn", CNN)) == 2_328_298


def test_cnn_flops_by_hand():
    convs = 26 * 26 * 16 * 9 * 1 + 24 * 24 * 32 * 9 * 16 + 10 * 10 * 64 * 9 * 32 + 8 * 8 * 128 * 9 * 64
    fcs = 2048 * 1024 + 1024 * 128 + 128 * 10
    assert CNN.forward_macs() == convs + fcs
    assert training_flops_per_sample(CNN) == 6 * (convs + fcs)


@pytest.mark.parametrize("size", ["tiny", "mini"])
def test_bert_formula_equals_torch_model(size):
    spec = BERT_SIZES[size]
    assert param_count(build_model("mlm", spec)) == spec.param_count()


def test_bert_tiny_shape():
    spec = BERT_SIZES["tiny"]
    assert (spec.layers, spec.hidden, spec.heads, spec.intermediate, spec.seq_len) == (2, 128, 2, 512, 128)
    assert spec.vocab_size == 33277 + 5
    assert spec.max_predictions == 20
    assert spec.param_count() == 4_723_586


def test_bert_logits_only_at_mask_positions():
    spec = BERT_SIZES["tiny"]
    model = build_model("mlm", spec)
    ids = torch.randint(5, spec.vocab_size, (2, spec.seq_len))
    logits = model(ids, torch.ones_like(ids), torch.zeros(2, spec.max_predictions, dtype=torch.int32))
    assert logits.shape == (2, spec.max_predictions, spec.vocab_size)


def test_learning_rate_warms_up_then_decays():
    optim = OptimSpec(lr=1e-3, warmup_fraction=0.1, end_lr_ratio=0.0)
    lrs = [learning_rate(s, 100, optim) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4)
    assert lrs[9] == pytest.approx(1e-3)  # peak at the end of warm-up
    assert all(a > b for a, b in zip(lrs[10:], lrs[11:]))  # strictly decaying
    assert lrs[-1] == pytest.approx(1e-3 * 1 / 90)
    assert learning_rate(100, 100, optim) == 0.0


def test_defaults_cover_every_workload():
    assert set(DEFAULTS) == set(WORKLOADS) == {"cnn", "mlm", "lm"}
