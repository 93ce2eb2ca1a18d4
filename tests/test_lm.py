"""The decoder LM workload (lm): its sizes are the predictor's model files, its data is WikiText-2's token stream
shifted by one, its initial weights cover the model, and the torch model and backends train it."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from backends.torch_common.models import DecoderLM, apply_rotary, build_model, rotary_tables
from backends.torch_common.trainer import TorchTrainer
from backends.torch_common.weights import load_initial_weights
from common import loop, stage_split
from common.config import RunConfig
from common.config_key import record_layout
from common.data.batches import TrainBatches, eval_batches, next_token_inputs
from common.data.datasets import load_split
from common.data.synthetic import synthetic_wikitext
from common.data.wikitext import pack_causal, token_stream
from common.final_params import FIELD as FINAL_PARAMS
from common.final_params import compared, deviation
from common.initial_weights import initial_weights, layout, trainable_count
from common.layout import Layout
from common.loop import run_loop
from common.predict import decoder
from common.predict.collectives import per_kind
from common.predict.executed import collectives
from common.predict.memory import activation_bytes, value_bytes
from common.predict.validation import run_layout
from common.results import validate_record
from common.spec import (
    LM_SIZES,
    PAD_ID,
    SIZES,
    SPECIAL_TOKENS,
    WIKITEXT2_VOCAB_SIZE,
    forward_flops,
    model_spec,
    training_flops_per_sample,
)
from tests.conftest import run_cli

TINY = model_spec("lm", "tiny")


@pytest.mark.parametrize("size", SIZES["lm"])
def test_each_size_is_the_model_file_the_predictor_reads(size):
    spec = model_spec("lm", size)
    assert spec == decoder.load(LM_SIZES[size]) and LM_SIZES[size] in decoder.available()
    assert spec.vocab == WIKITEXT2_VOCAB_SIZE  # the words of wiki.train.tokens and the special tokens
    assert trainable_count(spec) == spec.param_count()
    torch_model = DecoderLM(spec) if size == "tiny" else None
    if torch_model is not None:
        assert sum(p.numel() for p in torch_model.parameters()) == spec.param_count()


@pytest.mark.parametrize("change", [{"qk_norm": True}, {"norm_position": "output"}])
def test_the_lm_workload_refuses_a_decoder_whose_blocks_it_does_not_build(change):
    # OLMo 2's blocks are bench.predict's (common/predict/stacks.py olmo-core); no backend builds them, so no run
    # may train a Llama block in their name
    with pytest.raises(ValueError, match="the lm workload trains Llama-style decoders .rmsnorm before each sublayer, "
                                         "no QK-norm"):
        initial_weights(replace(TINY, **change), seed=0)


def test_packed_rows_make_every_token_after_the_first_a_label_once():
    stream = np.arange(10, 20, dtype=np.int32)   # ten tokens, seq_len 4: rows of 5 overlapping by one
    rows = pack_causal(stream, 4)
    assert rows.tolist() == [[10, 11, 12, 13, 14], [14, 15, 16, 17, 18], [18, 19, PAD_ID, PAD_ID, PAD_ID]]
    inputs = next_token_inputs(rows)
    weighted = inputs["labels"][inputs["label_weights"] == 1]
    assert weighted.tolist() == stream[1:].tolist()
    # each label is the token after its input
    assert (inputs["input_ids"][:, 1:] == inputs["labels"][:, :-1]).all()
    assert inputs["label_weights"].tolist()[2] == [1, 0, 0, 0]


def test_real_lm_data_covers_the_valid_split_once_and_weighs_the_global_batch(data_dir):
    data = load_split("lm", "valid", "real", data_dir, TINY, 0)
    assert data.arrays["tokens"].shape[1] == TINY.seq_len + 1
    stream = token_stream(data_dir, "valid")
    labels = [b["labels"][b["label_weights"] == 1] for b in eval_batches(data, TINY, 0, 0, 1, 64)]
    assert np.concatenate(labels).tolist() == stream[1:].tolist()
    train = TrainBatches(data, TINY, 0, per_device_batch=2, world=2, rank=1, micro_batches=2)
    step = train.get(3)
    glob = train.global_indices(3)
    assert step.denominator == float(next_token_inputs(data.arrays["tokens"][glob])["label_weights"].sum())
    assert [m["input_ids"].shape for m in step.micro] == [(2, TINY.seq_len)] * 2


def test_synthetic_lm_rows_are_one_longer_and_predictable_from_the_previous_token():
    tokens = synthetic_wikitext("valid", TINY.seq_len, seed=0, causal=True)
    assert tokens.shape == (1024, TINY.seq_len + 1) and tokens.min() >= len(SPECIAL_TOKENS)
    pairs = {}
    for a, b in zip(tokens[:, :-1].ravel(), tokens[:, 1:].ravel()):
        pairs.setdefault(a, []).append(b)
    # the successor table: the commonest next token follows about 90% of the time
    share = sum(max(np.bincount(v)) for v in pairs.values()) / sum(len(v) for v in pairs.values())
    assert 0.85 < share < 0.95


def test_rotary_positions_rotate_each_pair_half_a_head_apart():
    """Worked by hand for head_dim 4 (pairs (0, 2) and (1, 3)), position 2, theta 100: frequencies 1 and
    1/10, so pair (0, 2) turns by 2 radians and pair (1, 3) by 0.2."""
    cos, sin = rotary_tables(4, 3, 100.0)
    x = torch.tensor([1.0, 2.0, 3.0, 4.0]).view(1, 1, 1, 4).expand(1, 1, 3, 4)
    got = apply_rotary(x, cos, sin)[0, 0, 2]
    a, b = 2.0, 0.2
    want = [math.cos(a) * 1 - math.sin(a) * 3, math.cos(b) * 2 - math.sin(b) * 4,
            math.sin(a) * 1 + math.cos(a) * 3, math.sin(b) * 2 + math.cos(b) * 4]
    assert got.tolist() == pytest.approx(want, rel=1e-6)
    assert apply_rotary(x, cos, sin)[0, 0, 0].tolist() == [1.0, 2.0, 3.0, 4.0]  # position 0 does not turn


def test_the_decoder_is_causal_and_starts_from_the_shared_initial_weights():
    torch.manual_seed(0)
    model = build_model("lm", TINY)
    load_initial_weights(model, initial_weights(TINY, seed=0))  # raises if any tensor is left over either way
    assert len(layout(TINY)) == len(model.state_dict())
    ids = torch.randint(len(SPECIAL_TOKENS), TINY.vocab, (2, 16))
    later = ids.clone()
    later[:, 9:] = len(SPECIAL_TOKENS)
    with torch.no_grad():
        a, b = model(ids), model(later)
    assert torch.equal(a[:, :9], b[:, :9]) and not torch.allclose(a[:, 9:], b[:, 9:])
    # an untrained model spreads its guesses: the first loss is about ln(vocab)
    loss = torch.nn.functional.cross_entropy(a.flatten(0, 1), ids.roll(-1, 1).flatten())
    assert loss.item() == pytest.approx(math.log(TINY.vocab), rel=0.02)


@pytest.mark.usefixtures("one_torch_thread")
def test_early_stopping_counts_a_falling_perplexity_as_improvement(tmp_path, data_dir):
    """Trained on a few sequences it then evaluates on, the tiny decoder's perplexity falls every step: with
    --patience 1 the run must go on to its last step (a rising score would have stopped it after the second)."""
    cfg = RunConfig(run_id="t", backend="torch_ddp", workload="lm", devices=1, device_kind="cpu",
                    threads_per_device=1, scaling="weak", batch_size=4, per_device_batch=4, grad_accum=1,
                    data="real", data_dir=str(data_dir), seed=0, total_steps=4, warmup_steps=0, out=str(tmp_path),
                    eval_every=1, eval_samples=4, patience=1, skip_eval=True)
    valid = load_split("lm", "valid", "real", data_dir, TINY, 0)
    few = type(valid)("lm", "valid", False, {"tokens": valid.arrays["tokens"][:4]})
    model = build_model("lm", TINY)
    load_initial_weights(model, initial_weights(TINY, seed=0))
    outcome = run_loop(TorchTrainer(model, model, cfg, torch.device("cpu")), cfg, TrainBatches(few, TINY, 0, 4, 1, 0),
                       few)
    history = [h["value"] for h in outcome["eval_history"]]
    assert history == sorted(history, reverse=True) and len(set(history)) == len(history), history
    assert outcome["eval_history"][0]["value"] == pytest.approx(math.exp(outcome["eval_history"][0]["loss"]))
    assert not outcome["stopped_early"] and outcome["steps_done"] == cfg.total_steps
    assert loop.DEFAULTS["lm"].metric == "perplexity"


def _records(out):
    return sorted((json.loads(p.read_text()) for p in (out / "runs").glob("*.json")), key=lambda r: r["devices"])


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_two_ddp_ranks_train_the_decoder_as_one_device(tmp_path, data_dir):
    """torch_ddp at 1 and 2 devices on one global batch of 8 sequences: the same losses and perplexity, and
    records counted in tokens from the one FLOP formula."""
    out = tmp_path / "out"
    for devices in ("1", "2"):
        proc = run_cli("bench.run", "--backend", "torch_ddp", "--workload", "lm", "--devices", devices,
                       "--scaling", "strong", "--batch-size", "8", "--steps", "3", "--warmup-steps", "1",
                       "--eval-samples", "8", "--data", "real", "--out", str(out))
        assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = _records(out)
    for r in (one, two):
        assert r["status"] == "ok" and validate_record(r) == [] and r["global_batch"] == 8
        assert r["params"] == TINY.param_count() and r["flops_per_sample"] == training_flops_per_sample(TINY)
        assert r["tokens_per_s"] == pytest.approx(r["samples_per_s"] * TINY.seq_len)
        assert r["eval"]["metric"] == "perplexity" and r["eval"]["count"] == 8 * TINY.seq_len
        assert r["fit_check"]["verdict"] == "not checked"  # the executed model does not describe the decoder yet
    assert [c[1] for c in two["loss"]["curve"]] == pytest.approx([c[1] for c in one["loss"]["curve"]], rel=1e-5)
    assert two["eval"]["value"] == pytest.approx(one["eval"]["value"], rel=1e-5)
    assert one["loss"]["first"] == pytest.approx(math.log(TINY.vocab), rel=0.02)


# torch_3d's layouts of the tiny decoder, each held to torch_3d's 1-device run of the same global batch and
# micro-batches (bench.compare --layouts runs both): tensor parallel (again with the vocabulary split and recompute),
# FSDP, and a 1F1B pipeline.
LM_LAYOUTS = "fsdp2,tp2,tp2-rc-vocab,pp2-nmb2-1f1b"
# As tests/test_torch_3d.py's: the losses within RTOL, the final weights within FINAL_RTOL (common.final_params).
RTOL, FINAL_RTOL = 1e-5, 1e-4


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_torch_3d_lays_the_decoder_out_and_trains_what_one_device_trains(tmp_path, data_dir):
    out = tmp_path / "out"
    proc = run_cli("bench.compare", "--layouts", LM_LAYOUTS, "--backends", "torch_3d", "--workloads", "lm",
                   "--data", "real", "--steps", "3", "--warmup-steps", "1", "--skip-eval", "--batch-size", "8",
                   "--threads-per-device", "1", "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = _records(out)
    assert all(r["status"] == "ok" and validate_record(r) == [] for r in records), [r.get("error") for r in records]
    # the 1-device references accumulate as many micro-batches as the pipeline runs
    references = {r["config"]["grad_accum"]: r for r in records if r["devices"] == 1}
    runs = {record_layout(r).name: r for r in records if r["devices"] > 1}
    assert sorted(runs) == sorted(LM_LAYOUTS.split(","))
    for name, run in runs.items():
        ref = references[run["layout"]["micro_batches"]]
        assert run["global_batch"] == ref["global_batch"] == 8
        got, want = [c[1] for c in run["loss"]["curve"]], [c[1] for c in ref["loss"]["curve"]]
        assert got == pytest.approx(want, rel=RTOL), name
        final, final_ref = run["backend_metrics"][FINAL_PARAMS], ref["backend_metrics"][FINAL_PARAMS]
        assert set(final) == set(final_ref) == {t.name for t in layout(TINY)}, name
        assert all(not compared(w) or deviation(w, final[k]) <= FINAL_RTOL for k, w in final_ref.items()), name
    # Megatron's tensor-parallel count: per layer one all-reduce forward after wo and w2, and one backward for the
    # attention's input and the FFN's (each shared by its column-split projections), each a micro-batch of
    # activations
    tp = runs["tp2"]["backend_metrics"]["comm_per_step"]
    activation = 8 * TINY.seq_len * TINY.hidden * 4
    assert tp == [{"all_reduce": {**c["all_reduce"], "calls": 4 * TINY.layers, "bytes": 4 * TINY.layers * activation}}
                  for c in tp]
    assert runs["pp2-nmb2-1f1b"]["layout"]["layers_per_stage"] == [1, 1]
    # The predictor's collectives of the executed decoder (common/predict/executed.py, from the spec and layout) are
    # what every rank counted, call for call and byte for byte: the vocabulary split's embedding and loss, the
    # recomputed forward's one repeated all-reduce per layer, FSDP's. The pipeline's sends are left out: the
    # counted step is its first, which also exchanges shapes once.
    for name, run in runs.items():
        placed = run_layout(run)
        stages = [per_kind(collectives(TINY, placed, run["global_batch"], s, "torch_3d",
                                       value_bytes(run["config"]["precision"]), run["device_kind"]))
                  for s in range(placed.pp)]
        for rank, counted in enumerate(run["backend_metrics"]["comm_per_step"]):
            predicted = stages[placed.coordinates(rank)["pp"]]
            counted = {k: {"calls": c["calls"], "bytes": c["bytes"]} for k, c in counted.items() if k != "send_recv"}
            assert counted == {k: c for k, c in predicted.items() if k != "send_recv"}, (name, rank)


def test_a_pipeline_of_the_decoder_is_cut_by_its_stage_costs():
    """The decoder's forward multiply-adds by part add up to its FLOP count, and --stage-split auto weighs them:
    llama-mini's untied output layer (33,282 x 256 per token) outweighs one of its layers, so of 4 layers on 2
    stages the first takes 3."""
    mini = model_spec("lm", "mini")
    assert mini.layers * mini.layer_forward_macs() + mini.head_forward_macs() == forward_flops(mini) / 2
    assert mini.head_forward_macs() == mini.seq_len * mini.vocab * mini.hidden
    assert stage_split.layers_per_stage("auto", mini, 2, 8) == [3, 1]
    # Untied, the output layer is the head's own; tied, a pipeline's last stage updates a copy of the token table
    # in its place, and one stage updates the one table: its optimizer's share less
    tied = replace(mini, tied_embeddings=True)
    assert stage_split.tied_table(mini) == 0 and stage_split.tied_table(tied) == mini.vocab * mini.hidden
    assert stage_split.stage_costs(tied, [2, 2], 8) == stage_split.stage_costs(mini, [2, 2], 8)
    assert stage_split.stage_costs(mini, [4], 8)[0] - stage_split.stage_costs(tied, [4], 8)[0] == pytest.approx(
        stage_split.OPTIMIZER_FLOPS_PER_PARAM * mini.vocab * mini.hidden)


def test_the_decoder_s_last_stage_keeps_one_vocabulary_wide_tensor_per_micro_batch_in_flight():
    """Worked by hand for llama-tiny's last stage, fp32, micro-batches of 2 sequences: per micro-batch in flight its
    layer's stored values, the final norm's input and output (2 x 128 x 128 values a sequence) and log-softmax's
    output (128 x 33,282 floats); and once, for the micro-batch whose loss runs backward, two more of those. GPipe
    holds all 4 micro-batches of pp2-nmb4, 1F1B's last stage one."""
    vocab = 4 * TINY.seq_len * TINY.vocab
    per_micro_batch = 2 * (TINY.stored_activation_bytes(TINY.seq_len, value_bytes=4) + 4 * 2 * 128 * 128 + vocab)
    gpipe, one_f_one_b = (Layout(pp=2, micro_batches=4, schedule=s) for s in ("gpipe", "1f1b"))
    assert activation_bytes(TINY, gpipe, 1, 2, 4) == 4 * per_micro_batch + 2 * 2 * vocab
    assert activation_bytes(TINY, one_f_one_b, 1, 2, 4) == per_micro_batch + 2 * 2 * vocab
    # the first stage: its layer's values only, all 4 micro-batches under GPipe, 2 under 1F1B
    first = 2 * TINY.stored_activation_bytes(TINY.seq_len, value_bytes=4)
    assert activation_bytes(TINY, gpipe, 0, 2, 4) == 4 * first and activation_bytes(TINY, one_f_one_b, 0, 2, 4) == \
        2 * first
