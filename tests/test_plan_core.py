"""The planner's core, function by function (common/plan: space, rank, fit, check), on inputs small enough that
every expected figure is worked out by hand; tests/test_plan.py holds the planner end to end."""
from __future__ import annotations

from dataclasses import replace

import pytest

from common.errors import BadInput
from common.layout import Layout
from common.plan.check import fit_goal, fit_limits, goals
from common.plan.fit import GIB, DoesNotFit, measured_overhead, predicted_check, refusal, stage_split_of, verdict
from common.plan.rank import Ranked, decides, document, explain, memory_error, predicted, rank, ranking_error, row
from common.plan.space import (
    MAX_PLACEMENTS,
    Space,
    divisors,
    enumerate_layouts,
    meshes,
    nameable,
    placement,
    placements,
    splits,
)
from common.predict import hardware as hardware_files
from common.predict.basis import Basis
from common.predict.executed import memory_per_rank
from common.predict.prediction import Prediction
from common.predict.step import predict
from common.sections import FitCheck
from common.spec import BERT_SIZES, CNN, BertSpec, model_spec
from common.stats import spearman

TINY, MINI = BERT_SIZES["tiny"], BERT_SIZES["mini"]   # 2 and 4 encoder layers
CPU = hardware_files.load("cpu-loopback-2core")
BASIS = Basis(s_per_mac_sample=2e-11, s_per_micro_batch=0.0, s_per_param=1e-9, s_per_step=0.005,
              memory_overhead=300e6, training_overhead=None, threads_per_device=1, cores=2, label="by hand",
              record_ids=("hand",))
MIB = 2**20
# The mini MLM on two stages: even places 2+2 layers; --stage-split auto 3+1, since the last stage also holds
# the MLM head, whose projection onto the 33,282-word vocabulary outweighs a layer.
MINI_PP2 = Layout(pp=2, micro_batches=2)


# ----------------------------------------------------------------------------- the space

def test_the_meshes_are_every_factorisation_of_the_devices():
    assert meshes(4) == [(1, 1, 4), (1, 2, 2), (1, 4, 1), (2, 1, 2), (2, 2, 1), (4, 1, 1)]
    assert meshes(1) == [(1, 1, 1)]


def test_the_default_micro_batch_counts_divide_the_global_batch():
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert divisors(1) == [1]


def test_the_placements_are_every_contiguous_cut_with_a_layer_a_stage():
    assert placements(4, 2) == ("1,3", "2,2", "3,1")
    assert placements(4, 3) == ("1,1,2", "1,2,1", "2,1,1")
    assert placements(3, 1) == ("3",)


def test_the_stage_splits_tried_are_even_auto_and_the_placements_while_few():
    assert splits(MINI, 1) == ["even"]
    assert splits(CNN, 2) == ["even"]                         # the CNN's pipeline is cut evenly
    assert splits(TINY, 3) == ["even"]                        # 3 stages cannot hold 2 layers
    assert splits(TINY, 2) == ["even", "auto", "1,1"]         # as many stages as layers: one placement
    assert splits(MINI, 2) == ["even", "auto", "1,3", "2,2", "3,1"]
    # 17 layers on 2 stages: 16 cuts, as many as MAX_PLACEMENTS, all tried; 18 layers: 17, none.
    seventeen, eighteen = (BertSpec(f"l{n}", layers=n, hidden=128, heads=2, intermediate=512) for n in (17, 18))
    assert MAX_PLACEMENTS == 16
    assert splits(seventeen, 2) == ["even", "auto", *(f"{k},{17 - k}" for k in range(1, 17))]
    assert splits(eighteen, 2) == ["even", "auto"]


def test_a_layout_is_nameable_when_its_name_reads_back_as_itself():
    assert nameable(Layout(pp=2, micro_batches=4, stage_split="1,1"))
    assert not nameable(Layout(tp=2, schedule="1f1b"))        # tp2: no pipeline, the name drops 1f1b
    assert not nameable(Layout(tp=2, stage_split="auto"))     # nor a split of stages there are not
    assert not nameable(Layout())   # one device: "1 device" is a description, no layout name reads it back


def test_the_placement_is_the_layers_each_stage_holds():
    assert placement(TINY, Layout(dp=2), 32) is None          # no pipeline
    assert placement(CNN, Layout(pp=2, micro_batches=2), 32) is None
    assert placement(MINI, replace(MINI_PP2, stage_split="1,3"), 32) == (1, 3)
    assert placement(MINI, MINI_PP2, 32) == (2, 2)
    assert placement(MINI, replace(MINI_PP2, dp=2, stage_split="auto"), 32) == (3, 1)


def test_the_refused_are_counted_by_why():
    space = Space()
    for why in ("a", "b", "a"):
        space.refuse(why)
    assert space.refused == {"a": 2, "b": 1} and Space().refused == {}


def test_every_micro_batch_count_the_batch_divides_into_is_tried_by_default():
    """Tiny MLM, 2 devices, global batch 8: micro-batch counts 1, 2, 4, 8. dp2, fsdp2 and fsdp2-zero2 with and
    without recompute (6), tp2 with and without the vocabulary split and recompute (4), pp2 at 2, 4 and 8 micro-batches
    x 2 schedules x recompute (12; even, auto and 1,1 all place one layer a stage: one layout). pp2 at one
    micro-batch leaves a stage idle: refused once per schedule and recompute (4), not once per split."""
    space = enumerate_layouts(TINY, 2, 8)
    assert len(space.valid) == 6 + 4 + 12
    fewer = "--micro-batches 1 is fewer than the 2 pipeline stages"
    assert space.refused == {fewer: 4}
    # Every pipeline's even split is the one auto picks (one layer a stage); nothing else has a split.
    assert space.auto == {lay: [1, 1] for lay in space.valid if lay.pp == 2}
    assert all(lay.stage_split == "even" for lay in space.valid)


def test_splits_that_place_the_same_layers_are_kept_once_by_their_plainest_name():
    """Mini MLM on pp2: even places 2+2, auto 3+1. 2,2 is kept as even, auto as its counts 3,1."""
    space = enumerate_layouts(MINI, 2, 32, (2,))
    plain = [lay for lay in space.valid if lay.pp == 2 and lay.schedule == "gpipe" and not lay.recomputes]
    assert sorted(lay.name for lay in plain) == ["pp2-nmb2", "pp2-nmb2-split1+3", "pp2-nmb2-split3+1"]
    assert space.auto[replace(MINI_PP2, stage_split="3,1")] == [3, 1]
    assert len(space.auto) == 4   # one per schedule and recompute


def test_the_backend_refuses_what_it_cannot_run_with_its_reason():
    def no_pipelines(layout: Layout) -> str | None:
        return "no pipeline parallelism" if layout.pp > 1 else None

    space = enumerate_layouts(TINY, 2, 8, (2,), refuse=no_pipelines)
    assert sorted(lay.name for lay in space.valid) == sorted(
        ["dp2", "fsdp2", "fsdp2-zero2", "dp2-rc", "fsdp2-rc", "fsdp2-rc-zero2", "tp2", "tp2-vocab", "tp2-rc",
         "tp2-rc-vocab"])
    assert space.refused == {"no pipeline parallelism": 4}  # pp2-nmb2, gpipe and 1f1b, with and without rc
    assert space.auto == {}                                   # the layouts auto placed were refused


# ----------------------------------------------------------------------------- the ranking

def _prediction(layout: Layout, step: float | None = None, compute: float = 0.0, recompute: float = 0.0,
                comm: float = 0.0, bubble: float = 0.0, optimizer: float = 0.0, sync: float = 0.0,
                overhead: float = 0.0) -> Prediction:
    """A prediction with its parts given (compute includes recompute); its step their sum unless given."""
    total = compute + comm + bubble + optimizer + sync + overhead if step is None else step
    return Prediction(layout, layout.devices, 32, total, compute, comm, bubble, optimizer, overhead, sync, None,
                      [], None, None, [0.0], [], [], [], recompute_s=recompute)


def _row(layout: Layout, memory: float = 1.0, fit: str = "fits", **parts) -> Ranked:
    return Ranked(layout, _prediction(layout, **parts), memory, fit)


def test_the_ranking_error_skips_runs_without_a_step_error():
    runs = [{"step_s": {"error": 0.1}}, {}, {"step_s": {"error": None}}, {"step_s": {"error": -0.2}}]
    assert ranking_error({"runs": runs}) == pytest.approx(0.3)   # one pair: |0.1 - (-0.2)|
    assert ranking_error({"runs": runs[:3]}) is None


def test_the_memory_error_is_the_validation_s_largest_memory_error():
    validation = {"summary": {"all": {"memory_per_rank": {"max_abs_error": 0.07}}}}
    assert memory_error(validation) == 0.07
    for missing in (None, {}, {"summary": None}, {"summary": {"all": None}},
                    {"summary": {"all": {"memory_per_rank": None}}}):
        assert memory_error(missing) is None


def test_each_layout_is_predicted_with_its_placement_and_evaluation():
    auto = replace(MINI_PP2, stage_split="auto")   # placed 3+1: the placement predict is given
    rows = predicted(MINI, [auto], 32, CPU, BASIS, 1e12, None, backend="torch_3d", eval_batch=128)
    as_predicted = predict(MINI, auto, 32, CPU, BASIS, eval_batch=128)
    assert as_predicted.layout.stage_split == "3,1"
    assert rows[0].memory == max(as_predicted.memory_per_rank) and rows[0].step_s == as_predicted.step_s
    assert rows[0].fit == "fits"
    # 3+1 holds other layers per stage than the even 2+2; evaluating 128 sequences at once holds more than
    # training's micro-batches of 16: the peak is the evaluation's
    even = predict(MINI, MINI_PP2, 32, CPU, BASIS, eval_batch=128)
    assert rows[0].memory != max(even.memory_per_rank)
    assert rows[0].memory > max(predict(MINI, auto, 32, CPU, BASIS).memory_per_rank)
    # Without a measured overhead the peak is the model's count alone
    bare = replace(BASIS, memory_overhead=None)
    row = predicted(MINI, [auto], 32, CPU, bare, 1.0, None, backend="torch_3d")[0]
    assert row.memory == max(predict(MINI, auto, 32, CPU, bare).model_per_rank)
    assert row.fit == "does not fit"                          # one byte per device
    # Each backend holds its own state: keras_jax's FSDP shards are not torch_3d's
    fsdp = Layout(fsdp=2)
    keras = predicted(TINY, [fsdp], 32, CPU, BASIS, 1e12, None, backend="keras_jax")[0]
    assert keras.memory == max(predict(TINY, fsdp, 32, CPU, BASIS, "keras_jax").memory_per_rank)
    assert keras.memory != max(predict(TINY, fsdp, 32, CPU, BASIS, "torch_3d").memory_per_rank)


def test_the_rank_orders_fit_then_step_then_memory_then_name():
    rows = [_row(Layout(dp=2), 5, compute=1.0), _row(Layout(tp=2), 3, compute=1.0),
            _row(Layout(fsdp=2), 3, compute=1.0),
            _row(Layout(pp=2, micro_batches=2), 1, "may not fit", compute=0.5),   # fastest, but may not fit
            _row(Layout(dp=2, recompute="full"), 9, "not checked", compute=2.0),    # ranked as if it fits
            _row(Layout(tp=2, recompute="full"), 8, "does not fit", compute=0.25),
            _row(Layout(fsdp=2, recompute="full"), 8, "does not fit", compute=0.25),
            _row(Layout(tp=2, vocab_split=True), 7, "does not fit", compute=0.25)]
    ranked = rank(rows, error=None)
    assert [(r.layout.name, r.rank) for r in ranked] == [
        ("fsdp2", 1), ("tp2", 2), ("dp2", 3), ("dp2-rc", 4), ("pp2-nmb2", 5),
        ("tp2-vocab", 0), ("fsdp2-rc", 0), ("tp2-rc", 0)]          # dropped: the leanest first, then by name
    assert [r.separable for r in ranked[5:]] == [None] * 3 and all(r.decides == [] for r in ranked[5:])


def test_a_layout_is_separable_when_its_gap_to_the_pick_exceeds_the_ranking_error():
    pick, near, far = (_row(Layout(dp=2), compute=2.0), _row(Layout(tp=2), compute=2.5),
                       _row(Layout(pp=2, micro_batches=2), compute=3.0))
    faster = _row(Layout(dp=2, recompute="full"), fit="may not fit", compute=1.0)
    ranked = rank([far, faster, near, pick], error=0.25)
    # gaps to the pick's 2 s: 2.5 s +25% (not beyond 25%), 3 s +50%, 1 s -50% (faster, but ranked after)
    assert [(r.layout.name, r.separable) for r in ranked] == [("dp2", False), ("tp2", False), ("pp2-nmb2", True),
                                                              ("dp2-rc", True)]
    assert rank([pick, near], error=0.0)[0].separable is False   # the pick is no gap from itself


def test_what_decides_is_each_part_the_other_spends_more_on_largest_first():
    pick = _row(Layout(dp=2), compute=0.5, comm=0.25, optimizer=0.125, overhead=0.125)
    # compute 0.5 as the pick's (its 1.0 holds 0.5 of recompute); optimizer less than the pick's
    other = _row(Layout(tp=2), compute=1.0, recompute=0.5, comm=0.375, bubble=0.25, optimizer=0.0625,
                 overhead=0.1875)
    expected = [("recompute", 0.5), ("bubble", 0.25), ("comm_exposed", 0.125), ("overhead", 0.0625)]
    assert decides(pick, other) == expected
    assert rank([other, pick], error=None)[1].decides == expected


def test_the_pick_is_explained_by_where_its_step_goes():
    # Shares of a 2 s step: compute 1.375 - 0.375 = 1 s (50%), recompute 0.375 s (19%), exposed communication
    # 0.4 s (20%), optimizer 0.1 s (5%). Overhead is never named; a part below half a percent is left out
    # (bubble 0.004 / 2 = 0.2%), one at it kept (sync 0.01 / 2 = 0.5%, shown as 0%).
    pick = _row(Layout(dp=2), step=2.0, compute=1.375, recompute=0.375, comm=0.4, bubble=0.004, optimizer=0.1,
                sync=0.01, overhead=0.111)
    assert explain(pick, pick, None) == ("the pick; its step: compute 50%, recompute cost 19%, exposed "
                                         "communication 20%, optimizer 5%, waiting for other ranks 0%")


def test_a_layout_with_the_pick_s_step_is_told_apart_by_its_memory():
    pick = _row(Layout(dp=2), 2.0, compute=0.5)
    assert explain(_row(Layout(tp=2), 3.0, compute=0.5), pick, None) == \
        "the same predicted step as the pick, more memory"
    assert explain(_row(Layout(tp=2), 1.0, compute=0.5), pick, None) == \
        "the same predicted step as the pick, less memory"
    assert explain(_row(Layout(tp=2), 2.0, compute=0.5), pick, None) == "the same predicted step as the pick"


def test_a_slower_layout_names_up_to_three_parts_of_at_least_a_twentieth_of_its_extra():
    pick = _row(Layout(dp=2), compute=1.0)
    # extra 0.9375 s (+93.8%): recompute 500 ms, exposed communication 250, bubble 125, optimizer 62.5 (a
    # fourth part: not named)
    slower = _row(Layout(tp=2), compute=1.5, recompute=0.5, comm=0.25, bubble=0.125, optimizer=0.0625)
    slower.decides = decides(pick, slower)
    assert explain(slower, pick, None) == ("+93.8% against the pick: +500 ms recompute cost, "
                                           "+250 ms exposed communication, +125 ms pipeline bubble")
    # extra 156.25 ms (+15.6%): the bubble's 7.8125 ms is 5% of it exactly, and named
    close = _row(Layout(tp=2), compute=1.125, recompute=0.125, comm=0.0234375, bubble=0.0078125)
    close.decides = decides(pick, close)
    assert explain(close, pick, None) == ("+15.6% against the pick: +125 ms recompute cost, "
                                          "+23.4 ms exposed communication, +7.81 ms pipeline bubble")
    # a large model's gap of 1.25 s reads in milliseconds with a thousands separator, never 1.25e+03
    large = _row(Layout(tp=2), compute=1.0, comm=1.25)
    large.decides = decides(pick, large)
    assert explain(large, pick, None) == "+125.0% against the pick: +1,250 ms exposed communication"
    # a step longer than its parts (contention): no part to name
    contended = _row(Layout(tp=2), step=1.1, compute=1.0)
    assert explain(contended, pick, None) == "+10.0% against the pick"


def test_a_layout_that_may_not_fit_or_is_within_the_error_says_so():
    pick = _row(Layout(dp=2), compute=1.0)
    risky = _row(Layout(tp=2), fit="may not fit", compute=1.0, comm=0.5)
    risky.decides, risky.separable = decides(pick, risky), True
    assert explain(risky, pick, 0.25) == \
        "may not fit, ranked after those that fit; +50.0% against the pick: +500 ms exposed communication"
    # Where nothing fits, the pick may not fit either: nothing to say of the row's fit
    unsure = replace(pick, fit="may not fit")
    assert explain(risky, unsure, 0.25) == "+50.0% against the pick: +500 ms exposed communication"
    near = _row(Layout(tp=2), compute=1.0, comm=0.125)
    near.decides, near.separable = decides(pick, near), False
    assert explain(near, pick, 0.25) == ("+12.5% against the pick: +125 ms exposed communication; within the "
                                         "ranking error (25.0%): not separable from the pick")


def test_a_row_with_the_step_of_the_row_above_says_so():
    pick = _row(Layout(dp=2), compute=1.0)
    above = _row(Layout(tp=2), 2.0, compute=1.0, comm=0.5)
    same = "+50.0% against the pick: +500 ms exposed communication; the same predicted step as tp2"
    for memory, says in ((1.0, same + ", less memory"), (2.0, same), (3.0, same + ", more memory")):
        row = _row(Layout(pp=2, micro_batches=2), memory, compute=1.0, comm=0.5)
        row.decides = decides(pick, row)
        assert explain(row, pick, None, above) == says
    slower = _row(Layout(pp=2, micro_batches=2), compute=1.0, comm=0.75)
    slower.decides = decides(pick, slower)
    assert explain(slower, pick, None, above) == "+75.0% against the pick: +750 ms exposed communication"
    # Against the pick itself, or as the pick, nothing more is said
    twin = _row(Layout(tp=2), 2.0, compute=1.0)
    assert explain(twin, pick, None, pick) == "the same predicted step as the pick, more memory"
    assert explain(pick, pick, None, twin) == "the pick; its step: compute 100%"


# ----------------------------------------------------------------------------- the fit check

def test_the_verdict_allows_for_the_memory_error_either_way():
    assert verdict(120, 100, 0.2) == "may not fit"             # 120 / 1.2 = 100: not beyond the limit
    assert verdict(80, 100, 0.2) == "fits"                     # 80 / 0.8 = 100: within it
    assert verdict(110, 100, -0.2) == "may not fit"            # an error's sign does not matter
    # an error of 100% or more counts as 99%: 150 / 1.99 = 75 fits at best, 150 / 0.01 = 15,000 at worst
    assert verdict(150, 100, 5.0) == "may not fit"
    assert verdict(250, 100, 5.0) == "does not fit"            # 250 / 1.99 = 125.6


def test_the_stage_split_of_a_run_is_as_torch_3d_places_it():
    assert stage_split_of(TINY, Layout(dp=2), 32) is None
    assert stage_split_of(CNN, Layout(pp=2, micro_batches=2), 32) is None
    assert stage_split_of(TINY, Layout(pp=2, micro_batches=2), 32) == [1, 1]
    assert stage_split_of(MINI, replace(MINI_PP2, dp=2, stage_split="auto"), 32) == [3, 1]


def _record(run_id: str, started_at: str | None = "2026-11-01T00:00:00", peak: float | None = 2 * GIB,
            **changes) -> dict:
    """An ok 1-device run of the tiny MLM on torch_3d, cpu, host h, fp32, with its process peak."""
    record = {"run_id": run_id, "status": "ok", "devices": 1, "backend": "torch_3d", "workload": "mlm",
              "device_kind": "cpu", "host": {"name": "h"}, "step_time_s": {"p50": 0.5}, "global_batch": 32,
              "config": {"precision": "fp32", "model_size": "tiny", "skip_eval": True}, "layout": {},
              "memory": {"process_peak_per_rank": [peak]}}
    if started_at is not None:
        record["started_at"] = started_at
    return {**record, **changes}


def _overhead(records: list[dict], spec=TINY, backend: str = "torch_3d", workload: str = "mlm",
              precision: str = "fp32", host: str | None = "h") -> tuple[float, str] | None:
    return measured_overhead(spec, records, backend, workload, precision, "cpu", host)


def test_the_overhead_is_the_latest_matching_run_s_peak_beyond_the_model_s_count():
    early, late = _record("early", "2026-11-01T00:00:00"), _record("late", "2026-11-02T00:00:00", 3 * GIB)
    overhead, run_id = _overhead([late, early])
    assert run_id == "late"
    # The model's count is the same for both (the same run but its peak): their overheads differ by 1 GiB
    assert overhead - _overhead([early])[0] == GIB
    # A run without a start time is the oldest; one without a measured peak has no overhead: the one before
    assert _overhead([early, _record("undated", None)])[1] == "early"
    assert _overhead([early, _record("no peak", "2026-11-03T00:00:00", None)])[1] == "early"
    assert _overhead([_record("no peak", peak=None)]) is None and _overhead([]) is None


@pytest.mark.parametrize("changes", [
    {"status": "failed"}, {"devices": 2}, {"backend": "torch_ddp"}, {"workload": "cnn"}, {"device_kind": "cuda"},
    {"host": {"name": "other"}}, {"host": None}, {"step_time_s": {"p50": None}}, {"step_time_s": None},
    {"config": {"precision": "amp", "model_size": "tiny", "skip_eval": True}},
    {"config": {"precision": "fp32", "model_size": "mini", "skip_eval": True}}, {"layout": {"recompute": True}},
], ids=lambda c: next(iter(c)) + "=" + str(next(iter(c.values()))))
def test_a_run_that_differs_in_anything_the_overhead_depends_on_is_not_used(changes):
    # a later run differing in one thing is passed over for the earlier matching one
    other = _record("other", "2026-11-02T00:00:00", **changes)
    assert _overhead([other, _record("match")])[1] == "match"
    assert _overhead([other]) is None


def test_the_overhead_s_defaults_match_a_run_that_does_not_say():
    # No precision recorded: fp32. No host asked and none recorded: a match.
    unsaid = _record("unsaid", config={"model_size": "tiny", "skip_eval": True})
    assert _overhead([unsaid])[1] == "unsaid" and _overhead([unsaid], precision="amp") is None
    hostless = _record("hostless", host=None)
    assert _overhead([hostless], host=None)[1] == "hostless" and _overhead([hostless]) is None
    # No model size recorded: the tiny, as bench.run's default.
    unsized = _record("unsized", config={"precision": "fp32", "skip_eval": True})
    assert _overhead([unsized])[1] == "unsized" and _overhead([unsized], spec=MINI) is None
    # The decoder LM's tiny is its own model (llama-tiny), matched by the lm's size, not the MLM's.
    lm = _record("lm", workload="lm")
    assert _overhead([lm], spec=model_spec("lm", "tiny"), workload="lm")[1] == "lm"
    # The CNN has one size: any CNN run matches (its records carry no model size)
    cnn = _record("cnn", workload="cnn", backend="torch_ddp", config={"precision": "fp32"})
    assert _overhead([cnn], spec=CNN, backend="torch_ddp", workload="cnn")[1] == "cnn"


def test_a_backend_the_memory_model_does_not_describe_is_not_checked():
    check = predicted_check(TINY, Layout(dp=2), 32, "tf_mirrored", "fp32", None, 1000.7, "--memory-per-device")
    assert check == FitCheck(None, 1000, "--memory-per-device", "not checked", "not predicted: the memory model "
                             "describes torch_3d, torch_ddp, keras_jax, not tf_mirrored")
    assert predicted_check(TINY, Layout(dp=2), 32, "tf_mirrored", "fp32", None, None, "none").available_bytes is None


def test_a_layout_the_memory_model_cannot_place_is_not_checked_with_why():
    three_one = Layout(pp=2, micro_batches=2, stage_split="3,1")   # tiny has 2 layers
    check = predicted_check(TINY, three_one, 32, "torch_3d", "fp32", None, 2.5 * GIB, "limit")
    assert check == FitCheck(None, int(2.5 * GIB), "limit", "not checked",
                             "not predicted: stage_split [3, 1] does not cut 2 layers into 2 stages")


def test_the_fit_check_is_the_model_s_count_per_rank_plus_the_measured_overhead():
    layout = replace(MINI_PP2, stage_split="auto")   # placed 3+1 (torch_3d's auto split)
    _, model, _ = memory_per_rank(MINI, layout, 32, "amp", "torch_3d", 32)
    check = predicted_check(MINI, layout, 32, "torch_3d", "amp", 32, 4 * GIB, "--memory-per-device 4",
                            overhead=(300 * MIB, "r1"), error=0.1)
    assert check.predicted_per_rank == [int(m + 300 * MIB) for m in model]
    assert check.counts == ("state + activations + buffers + the evaluation's live values + the framework's "
                            "overhead 300 MiB measured by 1-device run r1")
    assert (check.available_bytes, check.limit, check.error) == (4 * GIB, "--memory-per-device 4", 0.1)
    # Without the overhead: the model's count alone, a lower bound; no evaluation, none of its values
    bare = predicted_check(MINI, layout, 32, "torch_3d", "amp", None, 4 * GIB, "limit")
    _, no_eval, _ = memory_per_rank(MINI, layout, 32, "amp", "torch_3d", None)
    assert bare.predicted_per_rank == [int(m) for m in no_eval]
    assert bare.counts == ("state + activations + buffers (no framework overhead: no 1-device run measured it; "
                           "a lower bound)")
    # fp32 activations take twice amp's bytes: more memory than amp
    assert max(predicted_check(MINI, layout, 32, "torch_3d", "fp32", None, GIB, "l").predicted_per_rank) > \
        max(bare.predicted_per_rank)


def test_the_fit_verdict_allows_for_the_error_given():
    layout = Layout(dp=2)
    peak = max(predicted_check(TINY, layout, 32, "torch_3d", "fp32", None, GIB, "l").predicted_per_rank)
    # a limit 10% above the peak: fits at the point, may not fit within a 20% error (peak / 0.8 > limit)
    assert predicted_check(TINY, layout, 32, "torch_3d", "fp32", None, 1.1 * peak, "l").verdict == "fits"
    assert predicted_check(TINY, layout, 32, "torch_3d", "fp32", None, 1.1 * peak, "l", error=0.2).verdict == \
        "may not fit"


def test_the_refusal_names_the_fullest_rank_against_the_limit():
    check = FitCheck([GIB, 3 * GIB, 2 * GIB], 2 * GIB, "--memory-per-device 2", "does not fit", "state", 0.1)
    assert refusal(check, Layout(dp=3)) == (
        "dp3 is predicted not to fit: rank 1 needs 3.000 GiB, --memory-per-device 2 allows 2.000 GiB per device "
        "(beyond the model's measured memory error 10%); counted: state; --no-fit-check runs it anyway")
    unknown = FitCheck(None, GIB, "limit", "not checked", "nothing")
    assert refusal(unknown, Layout(dp=2)) == ("dp2 is predicted not to fit: rank 0 needs 0.000 GiB, limit allows "
                                              "1.000 GiB per device; counted: nothing; --no-fit-check runs it anyway")
    refused = DoesNotFit("too big", check)
    assert isinstance(refused, BadInput) and refused.check is check and str(refused) == "too big"


# ----------------------------------------------------------------------------- the goals of plan-check

def test_spearman_needs_three_pairs_and_two_distinct_values_each_side():
    assert spearman([1, 2, 3], [1, 2, 3]) == pytest.approx(1.0)
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 2, 3], [1, 2]) is None
    assert spearman([5, 5, 5], [1, 2, 3]) is None
    # Two distinct values are enough: ranks 1.5 1.5 3 against 1 2 3; deviations -0.5 -0.5 1 and -1 0 1:
    # 1.5 / sqrt(1.5 x 2) = 0.866
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(1.5 / 3**0.5)
    assert spearman([1, 2, 3], [1, 1, 2]) == pytest.approx(1.5 / 3**0.5)
    # Ties take their average rank: 1 2.5 2.5 4 against 1 2 3 4: 4.5 / sqrt(4.5 x 5) (the lowest rank, 1 2 2 4,
    # would give 0.923)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx((4.5 / 5) ** 0.5)


def test_the_fit_limits_without_an_error_or_beyond_a_whole_one():
    # No memory error: e = 0. Peaks 3 MiB: the smallest 3, and the largest MiB below 3: 2.
    assert [round(g * 1024) for g in fit_limits({"rows": [{"memory_per_rank_max": 3 * MIB},
                                                          {"memory_per_rank_max": None}, {}]})] == [2, 3]
    # e = 300% counts as 99%: ceil(4 / 1.99) - 1 = 2, and the smallest peak, 4; a negative error as its size
    for error in (3.0, -1.0):
        assert [round(g * 1024) for g in fit_limits({"memory_error": error,
                                                     "rows": [{"memory_per_rank_max": 4 * MIB}]})] == [2, 4]
    # Limits of 0 MiB are none: half a MiB gives only 0; 1.5 MiB gives 1 either way
    assert fit_limits({"rows": [{"memory_per_rank_max": MIB // 2}]}) == []
    assert fit_limits({"rows": [{"memory_per_rank_max": 3 * MIB // 2}]}) == [1 / 1024]
    assert fit_limits({"rows": [{}]}) == []


def _measured(name: str, fit: str, peak: float | None) -> dict:
    return {"layout": name, "fit": fit, "measured": {"peak_per_rank_max": peak}}


def test_the_fit_goal_names_the_wrong_and_the_unmeasured_calls():
    limit = 2 * GIB
    plan = {"available_bytes": limit, "rows": [
        _measured("z", "does not fit", 1.5 * GIB), _measured("a", "does not fit", 2 * GIB),   # both within
        _measured("u", "does not fit", None), _measured("m", "does not fit", 3 * GIB),
        _measured("f", "fits", 1 * GIB)]}
    goal = fit_goal([plan])
    assert goal["wrong"] == ["a (measured 2.000 GiB, limit 2.000)", "z (measured 1.500 GiB, limit 2.000)"]
    assert goal["unmeasured"] == ["u"] and not goal["holds"]
    assert (goal["limits"], goal["calls"], goal["layouts_called"]) == (1, 4, 4)
    # the closest call: the smallest measured over limit, z's 1.5 / 2
    assert goal["closest"] == {"layout": "z", "limit_bytes": limit, "measured_over_limit": 0.75}
    unmeasured_only = {"available_bytes": limit, "rows": [_measured("u", "does not fit", None)]}
    assert fit_goal([unmeasured_only])["unmeasured"] == ["u"] and not fit_goal([unmeasured_only])["holds"]
    assert fit_goal([{"available_bytes": limit, "rows": [_measured("f", "fits", GIB)]}])["closest"] is None


def _run(name: str, step: float, samples_per_s: float | None) -> dict:
    return {"layout": name, "step_s": step, "fit": "fits",
            "measured": {"samples_per_s": samples_per_s, "step_s": 32 / samples_per_s if samples_per_s else None,
                         "peak_per_rank_max": GIB}}


def test_the_pick_goal_holds_at_exactly_the_allowed_share_of_the_fastest():
    # the pick measured 95 samples/s against the fastest's 100: 95%, the least allowed (PICK_WITHIN 5%)
    plan = {"pick": "p", "rows": [_run("p", 1.0, 95), _run("b", 2.0, 100), _run("c", 3.0, 50),
                                  _run("unmeasured", 4.0, None)]}
    result = goals(plan, [])
    assert result["pick"] == {"layout": "p", "measured_best": "b", "pick_samples_per_s": 95,
                              "best_samples_per_s": 100, "ratio": 0.95, "holds": True}
    # predicted p b c against measured b p c (by step: 32/95, 32/100, 32/50): d = 1, 1, 0 -> 1 - 6 x 2 / 24
    assert result["ranking"] == {"spearman": pytest.approx(0.5), "configurations": 3, "holds": False}
    slower = {**plan, "rows": [_run("p", 1.0, 94), *plan["rows"][1:]]}
    assert goals(slower, [])["pick"]["holds"] is False


def test_the_goals_without_a_measured_pick_or_ranking_do_not_hold():
    plan = {"pick": "p", "rows": [_run("p", 1.0, None), _run("b", 2.0, 100), _run("c", 3.0, 50)]}
    result = goals(plan, [])
    assert result["pick"] == {"layout": "p", "measured_best": "b", "pick_samples_per_s": None,
                              "best_samples_per_s": 100, "ratio": None, "holds": False}
    assert result["ranking"] == {"spearman": None, "configurations": 2, "holds": False}   # 2 pairs: no rho
    nothing = goals({"pick": "p", "rows": [_run("p", 1.0, None)]}, [])
    assert nothing["pick"] == {"layout": "p", "measured_best": None, "pick_samples_per_s": None,
                               "best_samples_per_s": None, "ratio": None, "holds": False}


def test_the_ranking_goal_holds_at_the_least_correlation_allowed():
    # Average ranks, predicted 8 9 2 2 4 5.5 2 5.5 7 and measured 8 9 1.5 3 1.5 7 5 5 5, both of mean 5:
    # deviations 3 4 -3 -3 -1 .5 -3 .5 2 and 3 4 -3.5 -2 -3.5 2 0 0 0; covariance 46, variances 57.5 each:
    # rho = 46 / 57.5 = 0.8, the least that holds (MIN_SPEARMAN)
    predicted, measured = [8, 9, 1, 1, 3, 4, 1, 4, 6], [8, 9, 1, 2, 1, 7, 6, 6, 6]
    plan = {"pick": "a", "rows": [_run(f"l{i}", p, 32 / m) for i, (p, m) in enumerate(zip(predicted, measured))]}
    assert goals(plan, [])["ranking"] == {"spearman": 0.8, "configurations": 9, "holds": True}


def test_the_plan_document_by_hand():
    """Five layouts of 2 devices, steps given: dp2 and tp2 alike (tp2 holds more), pp2 twice as slow, fsdp2-rc may not
    fit, fsdp2 does not; four refusal reasons; the ranking error 50%, the memory error 20%."""
    dp2 = _row(Layout(dp=2), 1 * GIB, compute=0.1)
    tp2 = _row(Layout(tp=2), 2 * GIB, compute=0.1)
    pp2 = _row(Layout(pp=2, micro_batches=2), 3 * GIB, compute=0.2)
    maybe = _row(Layout(fsdp=2, recompute="full"), 7 * GIB, "may not fit", compute=0.16)
    dropped = _row(Layout(fsdp=2), 9 * GIB, "does not fit", compute=0.05)
    rows = rank([pp2, dropped, tp2, maybe, dp2], 0.5)
    space = Space(valid=[r.layout for r in rows], refused={"x": 1, "y": 5, "z": 2, "w": 3})
    doc = document("T", {"devices": 2}, rows, space, "B", 8 * GIB, "L", 0.5, 0.2,
                   split_of=lambda layout: [1, 1] if layout.pp == 2 else None)
    assert doc["summary"] == [
        "space: 16 candidate layouts, 5 valid; 11 refused (5 x y; 3 x w; 2 x z; ...)",
        "memory: L, 8.00 GiB per device, allowing the model's measured memory error 20%: 1 predicted not to fit "
        "(dropped), 1 may not fit (kept, flagged)",
        "pick: dp2, predicted 320.0 samples/s (100 ms a step), 1.00 GiB on its fullest rank",
        "not separable from the pick within the ranking error 50.0%: tp2; measure them (bench.plan --run --repeats 3) "
        "to choose"]
    assert {k: doc[k] for k in ("title", "devices", "basis", "available_bytes", "memory_limit", "ranking_error",
                                "memory_error", "pick", "not_separable")} == {
        "title": "T", "devices": 2, "basis": "B", "available_bytes": 8 * GIB, "memory_limit": "L",
        "ranking_error": 0.5, "memory_error": 0.2, "pick": "dp2", "not_separable": ["tp2"]}
    assert doc["candidates"] == {"valid": 5, "fit": 4, "refused": 11, "reasons": space.refused}
    by_name = {r["layout"]: r for r in doc["rows"]}
    assert [r["layout"] for r in doc["rows"]] == ["dp2", "tp2", "pp2-nmb2", "fsdp2-rc", "fsdp2"]
    assert by_name["pp2-nmb2"] == {
        "rank": 3, "layout": "pp2-nmb2", "step_s": 0.2, "samples_per_s": 160.0, "memory_per_rank_max": 3 * GIB,
        "memory_per_rank": [0.0], "fit": "fits", "parts_s": pp2.parts, "separable": True,
        "decides": [["compute", pytest.approx(0.1)]], "explanation": explain(pp2, dp2, 0.5, tp2),
        "auto_split": False, "layers_per_stage": [1, 1]}
    assert "layers_per_stage" not in by_name["dp2"] and by_name["fsdp2"]["explanation"] == ""
    assert row(dp2, "x")["auto_split"] is False   # a row's split is the auto one only when it says so
    # the top K ranked only; a decoder's rate per device; no memory error known: point predictions
    decoder_row = replace(dp2, prediction=replace(dp2.prediction, seq_len=1024))
    doc = document("T", {}, [decoder_row, tp2], Space(valid=[dp2.layout, tp2.layout]), "B", 8 * GIB, "L", None,
                   None, top=1)
    assert [r["layout"] for r in doc["rows"]] == ["dp2"]
    assert doc["rows"][0]["tokens_per_s_per_device"] == 32 * 1024 / 0.1 / 2
    assert doc["summary"][0] == "space: 2 candidate layouts, 2 valid; 0 refused"
    assert doc["summary"][1].startswith("memory: L, 8.00 GiB per device (no measured memory error: point predictions)")
    assert doc["summary"][2].startswith("pick: dp2, predicted 163,840 tokens/s per device (100 ms a step)")
    assert doc["summary"][3] == ("ranking error unknown (no validation of the model on this kind of machine): the "
                                 "order rests on point predictions")
    # no error known: only a layout whose step is predicted the same is not told from the pick
    unknown = rank([replace(dp2), replace(tp2), replace(pp2)], None)
    assert [r.separable for r in unknown] == [None, None, None]
    doc = document("T", {}, unknown, Space(valid=[r.layout for r in unknown]), "B", 8 * GIB, "L", None, None)
    assert doc["not_separable"] == ["tp2"]
    # a known error that separates the pick from the rest; nothing that fits
    ahead = rank([dp2, pp2], 0.01)
    doc = document("T", {}, ahead, Space(valid=[r.layout for r in ahead]), "B", 8 * GIB, "L", 0.01, None)
    assert doc["summary"][3] == "the pick is ahead of every other layout by more than the ranking error 1.0%"
    assert doc["not_separable"] == []
    nothing = rank([dropped], 0.5)
    doc = document("T", {}, nothing, Space(valid=[dropped.layout]), "B", 8 * GIB, "L", 0.5, None)
    assert doc["summary"][2:] == ["no layout is predicted to fit"] and doc["pick"] is None
    # two layouts not told from the pick, each named once
    three = rank([dp2, tp2, replace(tp2, layout=Layout(tp=2, recompute="full"))], 0.5)
    doc = document("T", {}, three, Space(valid=[r.layout for r in three]), "B", 8 * GIB, "L", 0.5, None)
    assert doc["summary"][3] == ("not separable from the pick within the ranking error 50.0%: tp2, tp2-rc; measure "
                                 "them (bench.plan --run --repeats 3) to choose")
    # three reasons: all of them, no ellipsis; a step of 1.5 s in milliseconds
    slow = _row(Layout(dp=2), GIB, compute=1.5)
    space = Space(valid=[slow.layout], refused={"a": 1, "b": 2, "c": 3})
    doc = document("T", {}, rank([slow], None), space, "B", 8 * GIB, "L", None, None)
    assert doc["summary"][0] == "space: 7 candidate layouts, 1 valid; 6 refused (3 x c; 2 x b; 1 x a)"
    assert doc["summary"][2] == "pick: dp2, predicted 21.3 samples/s (1,500 ms a step), 1.00 GiB on its fullest rank"
