"""bench.plan: the space it enumerates against the layout grammar, the ranking and its explanation, the fit check
before launch (bench.run, bench.compare), and a plan made, explained and measured from a real layout sweep."""
from __future__ import annotations

import json
import math
from dataclasses import replace
from itertools import product

import pytest

from bench import compare
from bench import plan as plan_cli
from bench import run as bench_run
from bench.fit import VALIDATION
from bench.plan_run import attach_measured
from bench.plan_space import backend_refusal
from bench.reporting.compose import build_report
from bench.reporting.document import to_markdown
from bench.reporting.plan import PLANS_DIR
from bench.reporting.validation import FILE as VALIDATION_FILE
from common.errors import BadInput
from common.layout import Layout
from common.plan.check import fit_limits, goals
from common.plan.fit import GIB, verdict
from common.plan.rank import explain, predicted, rank, ranking_error
from common.plan.space import enumerate_layouts, placement
from common.predict import hardware as hardware_files
from common.predict.basis import Basis
from common.predict.step import predict
from common.predict.work import parts
from common.results import load_records, validate_record
from common.spec import BERT_SIZES
from common.stage_split import layers_per_stage
from common.stats import spearman

TINY, MINI = BERT_SIZES["tiny"], BERT_SIZES["mini"]
CPU = hardware_files.load("cpu-loopback-2core")
BASIS = Basis(s_per_mac_sample=2e-11, s_per_micro_batch=0.0, s_per_param=1e-9, s_per_step=0.005,
              memory_overhead=300e6, training_overhead=None, threads_per_device=1, cores=2, label="by hand",
              record_ids=("hand",))


# ----------------------------------------------------------------------------- the space

@pytest.mark.parametrize("spec", [TINY, MINI], ids=["tiny", "mini"])
def test_the_space_of_two_devices_counts_what_the_model_allows(spec):
    micro = (2, 4, 8)
    vocab = 2 if spec.vocab_size % 2 == 0 else 1          # tp2 with and without the vocabulary split
    data_parallel = 3 * 2                                  # dp2, fsdp2, fsdp2-zero2, each with and without recompute
    tensor_parallel = vocab * 2
    pipelines = len(micro) * 2 * math.comb(spec.layers - 1, 1) * 2   # x schedules x placements x recompute
    space = enumerate_layouts(spec, 2, 32, micro)
    assert len(space.valid) == data_parallel + tensor_parallel + pipelines


def _grammar(spec, devices: int, batch: int, micro: tuple[int, ...]) -> set[tuple]:
    """Every layout a name can say for `devices`, built from the name grammar's words (bench/layouts.py), valid
    for the model: keyed by what it executes (its fields and the layers each stage holds)."""
    found = set()
    for dp, tp in product(range(1, devices + 1), repeat=2):
        if devices % (dp * tp):
            continue
        pp = devices // (dp * tp)
        heads = [[f"dp{dp}", f"fsdp{dp}"] if dp > 1 else [""], [f"tp{tp}"] if tp > 1 else [""],
                 [f"pp{pp}"] if pp > 1 else [""]]
        words = [["rc", ""], ["vocab", ""] if tp > 1 else [""]]
        if pp > 1:
            cuts = [",".join(map(str, c)) for c in product(range(1, spec.layers + 1), repeat=pp)
                    if sum(c) == spec.layers]
            words += [[f"nmb{k}" for k in micro], ["gpipe", "1f1b"], ["", "splitauto", *(f"split{c.replace(',', '+')}"
                                                                                       for c in cuts)]]
        for head in product(*heads):
            for option in product(*words, ["zero2", ""] if head[0].startswith("fsdp") else [""]):
                name = "-".join(["x".join(h for h in head if h), *(w for w in option if w)])
                layout = Layout.parse(name)
                try:
                    layout.validate(spec, batch)
                except BadInput:
                    continue
                found.add((replace(layout, stage_split="even"), placement(spec, layout, batch)))
    return found


@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("spec", [TINY, MINI], ids=["tiny", "mini"])
def test_every_enumerated_layout_validates_and_none_valid_is_missing(spec, devices):
    micro = (1, 2, 4, 8)
    space = enumerate_layouts(spec, devices, 32, micro)
    for layout in space.valid:
        assert Layout.parse(layout.name) == layout
        layout.validate(spec, 32)
    enumerated = {(replace(lay, stage_split="even"), placement(spec, lay, 32)) for lay in space.valid}
    assert len(enumerated) == len(space.valid), "one layout enumerated twice"
    assert enumerated == _grammar(spec, devices, 32, micro)


def test_the_backend_refusals_are_its_own():
    torch_3d = backend_refusal("torch_3d", "mlm", "tiny", 2, 32, "fp32", CPU)
    keras = enumerate_layouts(TINY, 2, 32, (2, 4), backend_refusal("keras_jax", "mlm", "tiny", 2, 32, "fp32", CPU))
    assert keras.valid and all(lay.pp == 1 for lay in keras.valid)
    assert any("no pipeline parallelism" in why for why in keras.refused)
    assert torch_3d(Layout(pp=2, micro_batches=4)) is None
    cnn = backend_refusal("torch_3d", "cnn", "tiny", 2, 32, "fp32", CPU)
    assert "--model-parallel" in cnn(Layout(tp=2)) and cnn(Layout(fsdp=2)) is None


# ----------------------------------------------------------------------------- the ranking

def test_recompute_costs_one_more_forward_of_the_encoder_layers():
    plain, again = (predict(TINY, Layout(dp=2, recompute=rc), 32, CPU, BASIS) for rc in ("none", "full"))
    whole = parts(TINY)
    by_hand = BASIS.s_per_mac_sample * whole.layers * whole.layer * 16 / 3  # 16 samples a rank, forward = 1/3
    assert again.recompute_s == pytest.approx(by_hand) and plain.recompute_s == 0
    assert again.step_s - plain.step_s == pytest.approx(by_hand, rel=1e-9)
    # A basis measured with --recompute holds its own recomputation: predicting that run gives its own time back.
    measured = replace(BASIS, recompute=True)
    assert predict(TINY, Layout(recompute="full"), 32, CPU, measured).compute_s == \
        pytest.approx(predict(TINY, Layout(), 32, CPU, BASIS).compute_s)


def test_the_ranking_error_is_the_median_difference_of_two_layouts_errors():
    runs = [{"step_s": {"error": e}} for e in (0.10, -0.10, 0.0)]
    assert ranking_error({"runs": runs}) == pytest.approx(0.10)   # pairs: 0.2, 0.1, 0.1
    assert ranking_error({"runs": runs[:1]}) is None and ranking_error(None) is None


def test_the_plan_ranks_by_step_and_says_what_decides():
    layouts = enumerate_layouts(TINY, 2, 32, (2, 4, 8)).valid
    rows = rank(predicted(TINY, layouts, 32, CPU, BASIS, 64 * GIB, None, backend="torch_3d"), error=0.0)
    steps = [r.step_s for r in rows]
    assert steps == sorted(steps) and [r.rank for r in rows] == list(range(1, len(rows) + 1))
    pick, by_name = rows[0], {r.layout.name: r for r in rows}
    assert explain(pick, pick, 0.0).startswith("the pick")
    # Recompute adds its cost and nothing else.
    rc = by_name[replace(pick.layout, recompute="full").name] if not pick.layout.recomputes else None
    assert rc is not None and rc.decides[0][0] == "recompute" and "recompute cost" in explain(rc, pick, 0.0)
    # The model gives GPipe and 1F1B one step; 1F1B holds fewer micro-batches in flight.
    gpipe, one_f = by_name["pp2-nmb8"], by_name["pp2-nmb8-1f1b"]
    assert gpipe.step_s == one_f.step_s and one_f.memory < gpipe.memory
    if pick.layout.pp == 1:
        assert any(part == "bubble" for part, _ in gpipe.decides)
    # With an error wider than the whole range nothing is separable from the pick; with none, every gap counts;
    # with none known, the plan says it cannot tell.
    wide = rows[-1].step_s / pick.step_s
    loose = rank(list(rows), error=wide)
    assert all(r.separable is False for r in loose[1:]) and "not separable" in explain(loose[-1], loose[0], wide)
    assert all(r.separable == (r.step_s > pick.step_s) for r in rank(list(rows), error=0.0)[1:])
    assert all(r.separable is None for r in rank(list(rows), error=None))


def test_what_does_not_fit_is_dropped_and_what_may_not_fit_is_flagged():
    assert verdict(110, 100, None) == "does not fit" and verdict(100, 100, None) == "fits"
    assert verdict(110, 100, 0.2) == "may not fit"          # 110 / 1.2 < 100 < 110 / 0.8
    assert verdict(130, 100, 0.2) == "does not fit" and verdict(79, 100, 0.2) == "fits"
    assert verdict(1e12, None, None) == "not checked"
    layouts = [Layout(dp=2), Layout(fsdp=2), Layout(dp=2, recompute="full")]
    fsdp_memory = max(predict(TINY, layouts[1], 32, CPU, BASIS).memory_per_rank)
    rows = rank(predicted(TINY, layouts, 32, CPU, BASIS, fsdp_memory * 1.01, None, backend="torch_3d"), None)
    # Those that do not fit follow, unranked, the leanest first.
    assert [(r.layout.name, r.rank, r.fit) for r in rows] == [("fsdp2", 1, "fits"), ("dp2-rc", 0, "does not fit"),
                                                              ("dp2", 0, "does not fit")]
    # Within a memory error of 20% dp2 may not fit: it is ranked after fsdp2, which fits, however fast it is.
    no_optimizer = replace(BASIS, s_per_param=0.0)   # dp2 then steps faster than fsdp2 (fewer bytes sent)
    rows = rank(predicted(TINY, layouts[:2], 32, CPU, no_optimizer, fsdp_memory * 1.25, 0.2, backend="torch_3d"),
                None)
    assert [(r.layout.name, r.rank, r.fit) for r in rows] == [("fsdp2", 1, "fits"), ("dp2", 2, "may not fit")]
    assert rows[1].step_s < rows[0].step_s and explain(rows[1], rows[0], None).startswith("may not fit")


def test_the_check_goals_by_hand():
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert spearman([1, 2, 3], [5, 5, 5]) is None

    def row(name, step, sps, peak, fit="fits"):
        return {"layout": name, "step_s": step, "fit": fit,
                "measured": {"samples_per_s": sps, "step_s": 32 / sps, "peak_per_rank_max": peak}}
    plan = {"pick": "a", "available_bytes": 100,
            "rows": [row("a", 1.0, 97, 50), row("b", 1.1, 100, 60), row("c", 1.2, 200, 150),
                     row("d", 1.3, 80, 120, "does not fit")]}
    plan["rows"][2]["measured"].update(samples_per_s=99, step_s=32 / 99)
    tighter = {"available_bytes": 40, "rows": [{**r, "fit": "does not fit"} for r in plan["rows"]]}
    result = goals(plan, [plan, tighter])
    # a measured 97% of the fastest, b; the predicted order a b c d against the measured b c a d.
    assert result["pick"]["measured_best"] == "b" and result["pick"]["holds"]
    assert result["ranking"]["spearman"] == pytest.approx(0.4) and not result["ranking"]["holds"]
    fit = result["fit"]
    assert fit["holds"] and (fit["limits"], fit["calls"], fit["layouts_called"]) == (2, 5, 4)
    assert fit["closest"] == {"layout": "d", "limit_bytes": 100, "measured_over_limit": 1.2}  # of 50/40 and 120/100
    # d measured within the 100 of the first plan: a wrong call, named with both figures
    plan["rows"][3]["measured"]["peak_per_rank_max"] = 90
    tighter["rows"][3]["measured"]["peak_per_rank_max"] = 90
    assert goals(plan, [plan, tighter])["fit"]["wrong"] == ["d (measured 0.000 GiB, limit 0.000)"]
    assert not goals(plan, [plan, tighter])["fit"]["holds"]
    plan["rows"][3]["fit"] = "fits"     # no call made under any limit: nothing shown
    assert not goals(plan, [plan])["fit"]["holds"]


def test_the_fit_limits_are_where_the_planner_s_calls_change():
    """From the predictions alone: the smallest predicted peak, and each layout's largest MiB below P / (1 + e);
    just above that limit the layout is no longer called "does not fit", at it it is."""
    mib = 2**20
    plan = {"memory_error": 0.25, "rows": [{"memory_per_rank_max": 500 * mib}, {"memory_per_rank_max": 1000 * mib},
                                           {"memory_per_rank_max": 1001 * mib}]}
    limits = fit_limits(plan)
    assert [round(g * 1024) for g in limits] == [399, 500, 799, 800]  # 1000/1.25 = 800 exactly: 799 calls it
    for peak, gib in ((1000 * mib, 799 / 1024), (1001 * mib, 800 / 1024), (500 * mib, 399 / 1024)):
        assert verdict(peak, gib * 2**30, 0.25) == "does not fit"
        assert verdict(peak, (gib + 1 / 1024) * 2**30, 0.25) != "does not fit"


@pytest.mark.parametrize("args, says", [
    (["--devices", "1", "--assume-mfu", "0.4"], "--devices 1"),
    (["--devices", "2"], "--from RESULTS"),
    (["--devices", "2", "--assume-mfu", "0.4", "--run"], "--run measures on this machine"),
    (["--devices", "2", "--from", "{empty}"], "no 1-device mlm run on cpu"),
], ids=["one device", "no basis", "run an assumption", "no 1-device run"])
def test_bench_plan_bad_input_is_one_line(args, says, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        plan_cli.main([a.replace("{empty}", str(tmp_path)) for a in args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and says in err, err
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- the fit check before launch

def test_bench_run_refuses_a_run_predicted_not_to_fit_with_its_figures(tmp_path, capsys):
    out = tmp_path / "results"
    rc = bench_run.main(["--backend", "torch_3d", "--workload", "mlm", "--devices", "2", "--memory-per-device",
                         "0.25", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and not out.exists(), err
    assert "dp2 is predicted not to fit" in err and "allows 0.250 GiB" in err and "--no-fit-check" in err
    needs = float(err.split("needs ")[1].split(" GiB")[0])
    assert needs > 0.25


def test_a_sweep_records_a_run_that_does_not_fit_as_invalid_with_the_figures(tmp_path):
    out = tmp_path / "results"
    args = compare.build_parser().parse_args(["--layouts", "dp2,fsdp2", "--workloads", "mlm", "--out", str(out),
                                              "--memory-per-device", "0.175", "--skip-eval"])
    args.scaling, args.backends, args.job_nodes = "strong", ["torch_3d"], 0
    plan = compare.sweep_plan(args)
    invalid = compare.bad_input(args, plan, "layouts-x")
    refused = {plan[i][3].name: exc for i, exc in invalid.items()}
    # fsdp2 holds half the state; its 1-device reference, the whole model, does not fit either.
    assert set(refused) == {"dp2", "1 device"}, {k: str(v) for k, v in refused.items()}
    i = next(i for i in invalid if plan[i][3].name == "dp2")
    run_id = compare.run_one(args, "torch_3d", "mlm", 2, "layouts-x", tmp_path, plan[i][3], 1, invalid[i])
    record = next(r for r in load_records(out) if r["run_id"] == run_id)
    assert record["status"] == "invalid" and not validate_record(record)
    fit = record["fit_check"]
    assert fit["verdict"] == "does not fit" and fit["available_bytes"] == int(0.175 * GIB)
    assert max(fit["predicted_per_rank"]) > fit["available_bytes"] and "predicted not to fit" in record["error"]


def test_the_fit_check_reads_the_validation_file_bench_predict_writes():
    assert VALIDATION == VALIDATION_FILE


# ----------------------------------------------------------------------------- a real sweep

@pytest.mark.e2e
def test_a_run_that_fits_runs_and_keeps_its_prediction_beside_its_peak(layout_sweep):
    proc, out = layout_sweep   # conftest.LAYOUT_SWEEP runs with --memory-per-device
    assert proc.returncode == 0, proc.stderr[-2000:]
    for record in load_records(out):
        fit = record["fit_check"]
        assert record["status"] == "ok" and fit["verdict"] in ("fits", "may not fit")
        assert len(fit["predicted_per_rank"]) == record["devices"] == len(record["peak_memory_per_rank"])
        if "measured by 1-device run" not in fit["counts"]:   # no overhead known yet: a lower bound
            assert max(fit["predicted_per_rank"]) < max(record["peak_memory_per_rank"])


@pytest.mark.e2e
def test_a_plan_from_a_real_sweep_ranks_explains_and_meets_its_measurements(layout_sweep, tmp_path, capsys):
    proc, out = layout_sweep   # the tiny MLM's 1-device run at global batch 8, dp2 and tp2
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = tmp_path / "plan.json"
    assert plan_cli.main(["--devices", "2", "--from", str(out), "--global-batch", "8", "--skip-eval",
                          "--micro-batches", "2,4", "--top", "30", "--json", str(written)]) == 0
    printed = capsys.readouterr().out
    plan = json.loads(written.read_text())
    ranked = [r for r in plan["rows"] if r["rank"]]
    assert plan["pick"] == ranked[0]["layout"] and "pick:" in printed and plan["pick"] in printed
    assert len(plan["rows"]) == len(enumerate_layouts(TINY, 2, 8, (2, 4)).valid)
    # The errors come from validating the folder's dp2 and tp2 runs, computed as the plan was made.
    assert plan["ranking_error"] is not None and "computed now" in plan["basis"]
    assert not (out / VALIDATION).exists()
    for r in ranked[1:]:
        assert r["explanation"] and (r["separable"] or "not separable" in r["explanation"]
                                     or "same predicted step" in r["explanation"])
    for r in plan["rows"]:
        if r.get("layers_per_stage"):
            assert r["layers_per_stage"] == layers_per_stage("even", TINY, 2, 8)
    measured = attach_measured(plan, load_records(out))
    rows = {r["layout"]: r for r in measured["rows"]}
    for name in ("dp2", "tp2"):
        m = rows[name]["measured"]
        assert m["status"] == "ok" and m["low"] <= m["samples_per_s"] <= m["high"] and m["rank"] in (1, 2)
    assert "Measured: fastest" in measured["measured"]["summary"]
    (tmp_path / PLANS_DIR).mkdir()
    (tmp_path / PLANS_DIR / "p.json").write_text(json.dumps(measured))
    report = to_markdown(build_report(load_records(out), str(tmp_path))[0])
    assert "Plans: layouts chosen without trial runs" in report and "dp2" in report
