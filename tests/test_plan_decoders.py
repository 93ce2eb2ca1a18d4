"""bench.plan --model: a decoder LLM's layouts on a GPU cluster, enumerated (common.plan.decoders), predicted by the
decoders' step model from a device's compute table, held against the memory and ranked; a layout asked for is
placed in that ranking or refused in one line; a published run's layout is ranked in the plan for its cluster."""
from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import replace

import pytest

from bench import plan as plan_cli
from common.layout import Layout
from common.plan import decoders
from common.plan.fit import GIB
from common.predict import constants, decoder, published, stacks
from common.predict import hardware as hardware_files
from common.predict.gpu_compute import compute_for
from common.predict.step import predict

LLAMA = decoder.load("llama3-8b")   # 32 layers, 32 heads, 8 KV heads


def test_the_space_holds_every_kind_of_layout_the_model_costs_and_nothing_it_refuses():
    stack = stacks.load("megatron-te")
    space = list(decoders.candidates(LLAMA, 16, 32, stack, 8))
    names = {lay.name for lay in space}
    assert len(names) == len(space)                      # no layout twice
    for name in ("dp16-mbs1", "fsdp16-mbs2-sel", "dp2xfsdp8-mbs1-rc", "dp4xtp4-mbs1-sp-zero1-tpo-vocab",
                 "fsdp2xtp8-mbs1-sp-vocab", "tp8xpp2-mbs1-vp2-sp-tpo-vocab", "tp4xpp2xcp2-mbs2-1f1b",
                 "fsdp2xtp2xpp2xcp2-mbs1", "pp16-mbs2"):
        assert name in names, name
    assert all(lay.tp <= 8 and lay.cp <= 8 and lay.devices == 16 for lay in space)   # tp and cp within a node
    assert all(LLAMA.layers % (lay.pp * lay.virtual_stages) == 0 for lay in space if lay.virtual_stages > 1)
    assert not any(lay.zero1 and lay.fsdp > 1 for lay in space)
    assert {lay.fsdp > 1 for lay in space if lay.zero2} == {True}
    # torch's eager stack has no tensor-parallel overlap: the space leaves it out rather than predict it refused
    assert not any(lay.tp_overlap for lay in decoders.candidates(LLAMA, 16, 32, stacks.load("torch-eager"), 8))


def _names(space, tp: int, cp: int, pp: int) -> set[str]:
    return {lay.name for lay in space if (lay.tp, lay.cp, lay.pp) == (tp, cp, pp)}


def test_eight_devices_four_a_node_give_the_space_counted_by_hand():
    """4 layers, global batch 4, 8 devices, 4 a node: tp and cp from 1, 2, 4 (tp x cp = 16 does not divide 8), pp
    up to the 4 layers (not 8), and no dp8 (batch 4). A group's count: micro-batch sizes (powers of 2 dividing the
    batch a replica takes) x schedules (pp 1: gpipe; pp 2: gpipe, 1f1b, vp2; pp 4: gpipe, 1f1b) x 3 recomputes x
    sp and vocab split with tp > 1 (4) x the data split (dp and fsdp over each divisor, dp > 1 also with zero1,
    fsdp > 1 also with zero2): data 4 gives 6 splits, 2 gives 4, 1 gives 1."""
    eager = list(decoders.candidates(replace(LLAMA, layers=4), 8, 4, stacks.load("torch-eager"), 4))
    by_group = {(1, 1, 2): 1 * 3 * 3 * 6, (1, 1, 4): 2 * 2 * 3 * 4, (1, 2, 1): 1 * 1 * 3 * 6,
                (1, 2, 2): 2 * 3 * 3 * 4, (1, 2, 4): 3 * 2 * 3, (1, 4, 1): 2 * 1 * 3 * 4, (1, 4, 2): 3 * 3 * 3,
                (2, 1, 1): 1 * 1 * 3 * 4 * 6, (2, 1, 2): 2 * 3 * 3 * 4 * 4, (2, 1, 4): 3 * 2 * 3 * 4,
                (2, 2, 1): 2 * 1 * 3 * 4 * 4, (2, 2, 2): 3 * 3 * 3 * 4, (2, 4, 1): 3 * 3 * 4,
                (4, 1, 1): 2 * 1 * 3 * 4 * 4, (4, 1, 2): 3 * 3 * 3 * 4, (4, 2, 1): 3 * 3 * 4}
    assert Counter((lay.tp, lay.cp, lay.pp) for lay in eager) == by_group
    assert len(eager) == len({lay.name for lay in eager}) == 1173
    assert {lay.recompute for lay in eager} == {"none", "selective", "full"}
    assert not any(lay.sp or lay.vocab_split for lay in eager if lay.tp == 1)   # both split what tp splits
    schedules, recomputes = ("", "-1f1b"), ("", "-sel", "-rc")
    assert _names(eager, 1, 2, 4) == {f"pp4xcp2-mbs{b}{s}{r}" for b in (1, 2, 4) for s in schedules for r in recomputes}
    assert _names(eager, 1, 1, 4) == {f"{d}xpp4-mbs{b}{s}{r}{z}" for b in (1, 2) for s in schedules for r in recomputes
                                      for d, z in (("dp2", ""), ("dp2", "-zero1"), ("fsdp2", ""), ("fsdp2", "-zero2"))}
    assert _names(eager, 4, 2, 1) == {f"tp4xcp2-mbs{b}{r}{sp}{v}" for b in (1, 2, 4) for r in recomputes
                                      for sp in ("", "-sp") for v in ("", "-vocab")}
    assert _names(eager, 1, 1, 2) == {f"{d}xpp2-mbs1{s}{r}{z}" for s in ("", "-1f1b", "-vp2") for r in recomputes
                                      for d, z in (("dp4", ""), ("dp4", "-zero1"), ("dp2xfsdp2", ""),
                                                   ("dp2xfsdp2", "-zero2"), ("fsdp4", ""), ("fsdp4", "-zero2"))}
    # A stack that overlaps tensor-parallel communication: every tp > 1 layout with and without it.
    te = list(decoders.candidates(replace(LLAMA, layers=4), 8, 4, stacks.load("megatron-te"), 4))
    assert len(te) == 1173 + sum(n for (tp, _, _), n in by_group.items() if tp > 1) == 2085
    overlapped = [lay for lay in te if (lay.tp, lay.cp, lay.pp) == (2, 2, 1) and lay.tp_overlap]
    assert sorted(replace(lay, tp_overlap=False).name for lay in overlapped) == sorted(_names(eager, 2, 2, 1))


def test_six_devices_four_a_node_leave_out_what_does_not_divide_six():
    """tp x cp of 4 (1x4, 2x2, 4x1) and 8 do not divide 6: with 4 layers, tp and cp of 1 or 2 times pp of 1, 2, 3
    (not 6) give what is left, and the other factor of 6 is the data split."""
    space = list(decoders.candidates(replace(LLAMA, layers=4), 6, 6, stacks.load("torch-eager"), 4))
    assert {(lay.tp, lay.cp, lay.pp, lay.dp * lay.fsdp) for lay in space} == {
        (1, 1, 1, 6), (1, 1, 2, 3), (1, 1, 3, 2), (1, 2, 1, 3), (1, 2, 3, 1), (2, 1, 1, 3), (2, 1, 3, 1)}


def test_the_micro_batch_sizes_and_the_interleaved_stages_stop_at_their_bounds():
    """2 devices, one a node, 144 layers, batch 64: a replica's batch of 64 or 32 takes micro-batches 1 to 16 (not
    32); a 2-stage pipeline interleaves v chunks where 2v divides 144, v from 2 up to 8 (not 9)."""
    space = list(decoders.candidates(replace(LLAMA, layers=144), 2, 64, stacks.load("torch-eager"), 1))
    assert {(lay.pp, lay.micro_batch_size) for lay in space} == {(pp, b) for pp in (1, 2) for b in (1, 2, 4, 8, 16)}
    assert {(lay.pp, lay.schedule, lay.virtual_stages) for lay in space} == {
        (1, "gpipe", 1), (2, "gpipe", 1), (2, "1f1b", 1), *((2, "interleaved", v) for v in (2, 3, 4, 6, 8))}


def test_the_plan_ranks_what_fits_fastest_first_and_drops_the_rest():
    hw = hardware_files.load("h100-sxm-8")
    rows, space = decoders.plan(LLAMA, 8, 16, hw, stacks.load("torch-compile"), compute_for(hw),
                                hw.memory_bytes)
    ranked = [r for r in rows if r.rank]
    assert len(space.valid) == len(rows) and sum(space.refused.values()) > 0
    # each reason counted once for every candidate refused for it, the layouts' names left out
    odd = replace(LLAMA, vocab=LLAMA.vocab + 1)    # no tp divides it: every vocabulary split refused
    _, refused = decoders.plan(odd, 8, 16, hw, stacks.load("torch-compile"), compute_for(hw), hw.memory_bytes)
    assert refused.refused[f"vocabulary {odd.vocab} is not divisible by tp 2"] > 1
    assert [r.rank for r in ranked] == list(range(1, len(ranked) + 1))
    assert [r.step_s for r in ranked] == sorted(r.step_s for r in ranked)
    assert all(r.memory <= hw.memory_bytes for r in ranked)
    assert all(r.memory > hw.memory_bytes and not r.rank for r in rows[len(ranked):])
    # a layout of the space asked for is found where it ranks
    plan = decoders.decoder_plan("llama3-8b", 8, 16, "h100-sxm-8", "torch-compile", None, None, None, 3,
                                 ranked[2].layout.name)
    assert plan["asked"]["rank"] == 3 and plan["asked"]["step_s"] == ranked[2].step_s
    # one outside it (micro-batches of 3: the space tries powers of two) is placed among the ranked rows
    rows = [r for r in decoders.plan(LLAMA, 8, 48, hw, stacks.load("torch-compile"), compute_for(hw),
                                     hw.memory_bytes)[0] if r.rank]
    asked = decoders.decoder_plan("llama3-8b", 8, 48, "h100-sxm-8", "torch-compile", None, None, None, 3,
                                  "fsdp8-mbs3-rc")["asked"]
    assert asked["layout"] not in {r.layout.name for r in rows}
    assert asked["rank"] == 1 + sum(1 for r in rows if r.step_s < asked["step_s"]) > 1


def test_every_bundled_decoder_plans_on_every_gpu_with_a_compute_table():
    gpus, models = constants.gpu_hardware(), decoder.available()
    assert len(gpus) >= 2 and len(models) > len(gpus)
    for i, model in enumerate(models):   # every decoder, and every GPU in turn, on a stack that builds its blocks
        hardware = gpus[i % len(gpus)]
        stack = "olmo-core" if decoder.load(model).qk_norm else "torch-compile"
        plan = decoders.decoder_plan(model, 8, 8, hardware, stack, 2048, None, None, 3)
        assert plan["candidates"]["valid"] > 0, (model, hardware)
        assert (plan["pick"] is None) == (plan["candidates"]["fit"] == 0), (model, hardware)
        if plan["pick"]:
            assert plan["rows"][0]["layout"] == plan["pick"] and plan["rows"][0]["rank"] == 1
    # the smallest fits 8 GPUs, the largest does not (405B's weights alone are 810 GB in bf16)
    assert decoders.decoder_plan("llama3-8b", 8, 8, "h100-sxm-8", "torch-compile", 2048, None, None, 3)["pick"]
    assert decoders.decoder_plan("llama3-405b", 8, 8, "h100-sxm-8", "torch-compile", 2048, None, None, 3)["pick"] \
        is None


def _main(capsys, *argv):
    with pytest.raises(SystemExit) as code:
        plan_cli.main(list(argv))
    return code.value.code, capsys.readouterr()


def test_a_layout_asked_for_is_placed_or_refused_in_one_line(capsys):
    base = ["--model", "llama3-8b", "--hardware", "h100-sxm-8", "--devices", "8", "--global-batch", "16",
            "--seq-len", "2048", "--stack", "torch-compile", "--top", "3"]
    assert plan_cli.main([*base, "--layout", "fsdp-mbs1-sel"]) == 0
    out = capsys.readouterr().out
    assert "fsdp8-mbs1-sel" in out and "pick:" in out
    # the prediction beside the error its model has against measured clusters
    checked = published.check()
    assert (f"the step model against {checked['predicted']} published GPU-cluster runs: median |error| "
            f"{checked['median_abs_error']:.1%}, largest {checked['max_abs_error']:.1%}") in " ".join(out.split())
    # one that does not fit: the predicted and the available figures
    code, io = _main(capsys, *base, "--layout", "fsdp-mbs1", "--memory-per-device", "10")
    assert code == 2 and len(io.err.strip().splitlines()) == 1
    assert re.search(r"does not fit: predicted [0-9]{1,3}\.[0-9] GiB on its fullest rank, 10\.0 GiB available", io.err)
    # one the model cannot express, before any search
    for name, why in (("fsdp-fp8", "fp8 is the software's, not the layout's"), ("tp3xdp", "do not divide them"),
                      ("fsdp-splitauto", "needs a pipeline")):
        code, io = _main(capsys, *base, "--layout", name)
        assert code == 2 and why in io.err and len(io.err.strip().splitlines()) == 1, name
    code, io = _main(capsys, "--model", "llama3-8b", "--devices", "8")
    assert code == 2 and "--model needs --devices, --global-batch and --hardware" in io.err


def test_a_published_layout_is_ranked_in_the_plan_for_its_cluster():
    points = [p for p in published.all_points() if p.devices == 8 and not published.refusal(p)]
    assert points   # torchtitan's 8B on 8 H100, eager and compiled
    result = decoders.published_ranking(points)
    for row, point in zip(result["points"], points):
        assert row["published_layout"] == Layout.parse(point.layout, point.devices).name
        assert row["rank"] >= 1 and row["pick_faster"] >= 0 and row["fitting"] >= row["rank"]
        assert row["fit"] == "fits" and Layout.parse(row["pick"], point.devices).name == row["pick"]
        assert (row["rank"] == 1) == (row["pick_faster"] == 0)
        assert row["published_memory_gib"] * GIB <= hardware_files.load(point.hardware).memory_bytes
    table = plan_cli.published_markdown(result)
    assert table.count("\n") == len(points) + 1 and "torchtitan 8B FSDP, 8 H100" in table


def test_a_stack_refuses_in_one_line_what_its_code_does_not_run_and_the_plan_never_picks_it():
    hw = hardware_files.load("h100-sxm-8")
    compute, titan, megatron = compute_for(hw), stacks.load("torch-compile"), stacks.load("megatron-te")
    for name, why in (("dp4xtp2-mbs1-sp-zero1", "no ZeRO-1"), ("dp4xtp2-mbs1-sp", "DDP only alone"),
                      ("fsdp4xtp2-mbs1", "SequenceParallel")):
        with pytest.raises(ValueError, match=why) as refused:
            predict(LLAMA, Layout.parse(name, 8), 16, hw, compute, stack=titan)
        assert "\n" not in str(refused.value) and "torch-compile does not run it" in str(refused.value)
    for name in ("fsdp4xtp2-mbs1-sp", "dp8-mbs1", "dp2xfsdp4-mbs1", "fsdp4xcp2-mbs1", "cp8-mbs1"):
        # FSDP with tp, DDP alone, HSDP, FSDP over the data and context ranks, FSDP over cp alone
        assert predict(LLAMA, Layout.parse(name, 8), 16, hw, compute, stack=titan).step_s > 0
    with pytest.raises(ValueError, match="shards no parameters"):
        predict(LLAMA, Layout.parse("fsdp8-mbs1", 8), 16, hw, compute, stack=megatron)
    rows, space = decoders.plan(LLAMA, 8, 16, hw, titan, compute, hw.memory_bytes)
    for r in rows:
        lay = r.layout
        assert not (lay.zero1 or (lay.tp > 1 and not lay.sp)
                    or (lay.dp > 1 and lay.fsdp == 1 and lay.devices > lay.dp)), lay.name
    assert any("no ZeRO-1" in why for why in space.refused) and any("DDP" in why for why in space.refused)
    assert not any(r.layout.fsdp > 1 for r in decoders.plan(LLAMA, 8, 16, hw, megatron, compute,
                                                            hw.memory_bytes)[0])


def test_a_published_ranking_row_is_its_plans_asked_layout_against_the_pick(monkeypatch):
    """Each point the model predicts (a refused one skipped, the rest still ranked) planned at its own model,
    devices, batch, hardware, stack and sequence, its layout asked, one row shown; the row from that plan: the
    published layout, its rank and fit, the layouts that fit, the pick and how much faster (0.75 s / 0.5 s - 1)."""
    points = {p.name: p for p in published.all_points()}
    refused = points["BLOOM 176B, 384 A100"]   # its stack is not described, a100-sxm-8 has no compute table
    ok = [replace(points["torchtitan 8B FSDP, 8 H100"], seq_len=4096), points["megatron 1.7B, 48 H100"]]
    planned = []

    def plan(model, devices, batch, hardware, stack, seq_len, memory_gib, mfu, top, asked):
        planned.append((model, devices, batch, hardware, stack, seq_len, memory_gib, mfu, top, asked))
        fits = len(planned) == 1
        return {"asked": {"layout": "dp8-mbs1", "rank": 3 if fits else 0, "fit": "fits" if fits else "does not fit",
                          "step_s": 0.75, "memory_per_rank_max": 3 * GIB},
                "rows": [{"layout": "tp8-mbs1", "step_s": 0.5}, {"layout": "pp8-mbs1", "step_s": 0.6}] if fits else [],
                "candidates": {"fit": 17 if fits else 0}}
    monkeypatch.setattr(decoders, "decoder_plan", plan)
    monkeypatch.setattr(published, "all_points", lambda: [refused, *ok])
    assert decoders.published_ranking() == {"points": [
        {"point": ok[0].name, "published_layout": "dp8-mbs1", "rank": 3, "fit": "fits", "fitting": 17,
         "pick": "tp8-mbs1", "pick_faster": 0.5, "published_memory_gib": 3.0},
        {"point": ok[1].name, "published_layout": "dp8-mbs1", "rank": 0, "fit": "does not fit", "fitting": 0,
         "pick": None, "pick_faster": None, "published_memory_gib": 3.0}]}
    assert planned == [(p.model, p.devices, p.global_batch, p.hardware, p.stack, p.seq_len, None, None, 1, p.layout)
                       for p in ok]
    # Points given: those alone.
    assert [r["point"] for r in decoders.published_ranking([ok[1]])["points"]] == [ok[1].name]


def test_the_published_ranking_table_by_hand():
    result = {"points": [
        {"point": "a 8B, 8 H100", "published_layout": "fsdp8-mbs2", "rank": 3, "fitting": 1234, "pick": "fsdp8-mbs1",
         "pick_faster": 0.125, "fit": "fits", "published_memory_gib": 40.0},
        {"point": "b | 70B", "published_layout": "fsdp8", "rank": 0, "fitting": 7, "pick": "tp8", "pick_faster": -0.5,
         "fit": "does not fit", "published_memory_gib": 90.25}]}
    assert plan_cli.published_markdown(result).splitlines() == [
        "| published run | its layout | rank in the plan | of | the plan's pick | pick predicted faster by |",
        "|---|---|---|---|---|---|",
        "| a 8B, 8 H100 | `fsdp8-mbs2` | 3 | 1,234 | `fsdp8-mbs1` | +12.5% |",
        "| b \\| 70B | `fsdp8` | - (does not fit: 90.2 GiB) | 7 | `tp8` | -50.0% |"]


def test_the_published_ranking_is_printed_and_written(capsys, tmp_path, monkeypatch):
    result = {"points": [{"point": "p", "published_layout": "dp8", "rank": 1, "fitting": 2, "pick": "dp8",
                          "pick_faster": 0.0, "fit": "fits", "published_memory_gib": 1.0}]}
    monkeypatch.setattr(decoders, "published_ranking", lambda: result)
    out = tmp_path / "ranking.json"
    assert plan_cli.main(["--published", "--json", str(out)]) == 0
    assert plan_cli.published_markdown(result) in capsys.readouterr().out
    assert json.loads(out.read_text()) == result


def test_a_decoder_plan_is_written_with_the_models_error_against_published_runs(capsys, tmp_path):
    out = tmp_path / "plan.json"
    assert plan_cli.main(["--model", "llama3-8b", "--hardware", "h100-sxm-8", "--devices", "8", "--global-batch",
                          "16", "--seq-len", "2048", "--stack", "torch-compile", "--top", "2", "--json",
                          str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    plan, checked = json.loads(out.read_text()), published.check()
    assert plan["model_error"] == {k: checked[k] for k in ("predicted", "median_abs_error", "max_abs_error",
                                                           "worst_median_abs_error", "worst_max_abs_error")}
    assert plan["summary"][-1].endswith("(python -m bench.predict --published); the order it gives two layouts of "
                                        "one cluster is checked against no measurement")
    assert plan["summary"][-1] in printed and "tokens/s/device" in printed and "samples/s" not in printed
    top = plan["rows"][0]
    assert f"{top['tokens_per_s_per_device']:,.0f}" in printed and f"plan: {out}" in printed


def test_a_decoder_plan_document_by_hand():
    """At --seq-len 2048 and --memory-per-device 60, 8 H100 at batch 24: the title, the limit, the rows of the plan
    made at that sequence, the reasons as the stack and the grammar give them, and the asked layout (micro-batches
    of 3: outside the space) placed against the pick under the same limit."""
    plan = decoders.decoder_plan("llama3-8b", 8, 24, "h100-sxm-8", "torch-compile", 2048, 60, None, 2, "fsdp8-mbs3-rc")
    assert plan["title"] == "llama3-8b on 8 x h100-sxm-8 (torch-compile), global batch 24, sequence 2048"
    assert (plan["seq_len"], plan["memory_limit"], plan["available_bytes"]) == (2048, "--memory-per-device 60 GiB",
                                                                               60 * GIB)
    assert {k: plan[k] for k in ("model", "devices", "hardware", "stack", "global_batch")} == {
        "model": "llama3-8b", "devices": 8, "hardware": "h100-sxm-8", "stack": "torch-compile", "global_batch": 24}
    hw = hardware_files.load("h100-sxm-8")
    spec = decoder.load("llama3-8b")
    rows, _ = decoders.plan(replace(spec, seq_len=2048), 8, 24, hw, stacks.load("torch-compile"), compute_for(hw),
                            60 * GIB)
    assert [(r["layout"], r["step_s"]) for r in plan["rows"]] == [(r.layout.name, r.step_s) for r in rows[:2]]
    reasons = plan["candidates"]["reasons"]
    assert "--micro-batches 3 is fewer than the 4 pipeline stages" in reasons
    assert any(why.startswith("torch-compile does not run it: torchtitan 9dec370 has no ZeRO-1") for why in reasons)
    asked, pick = plan["asked"], plan["rows"][0]
    assert asked["fit"] == "fits" and asked["memory_per_rank_max"] <= 60 * GIB
    assert asked["rank"] == 1 + sum(1 for r in rows if r.rank and r.step_s < asked["step_s"])
    assert asked["explanation"].startswith(f"{asked['step_s'] / pick['step_s'] - 1:+.1%} against the pick")
    # without a limit given, the device's memory, named
    assert decoders.decoder_plan("llama3-8b", 8, 24, "h100-sxm-8", "torch-compile", 2048, None, None, 1)[
        "memory_limit"] == "h100-sxm-8's memory"
    tight = decoders.decoder_plan("llama3-8b", 8, 24, "h100-sxm-8", "torch-compile", 2048, 20, None, 1,
                                  "fsdp8-mbs3-rc")["asked"]
    assert (tight["fit"], tight["rank"]) == ("does not fit", 0)
    assert tight["explanation"] == ""   # nothing to say against the pick of a plan it has no place in


def test_a_layout_outside_the_space_ranks_ahead_of_the_layouts_it_ties():
    # pp2-nmb4 names pp2-mbs2's run by its count (4 micro-batches of 2 in the batch of 8): outside the space, which
    # names sizes, and predicted the same step; it takes the first rank of the layouts as fast as it.
    plan = decoders.decoder_plan("llama3-8b", 2, 8, "h100-sxm-8", "torch-compile", 2048, 200, None, 1, "pp2-nmb4")
    hw = hardware_files.load("h100-sxm-8")
    rows, _ = decoders.plan(replace(LLAMA, seq_len=2048), 2, 8, hw, stacks.load("torch-compile"), compute_for(hw),
                            200 * GIB)
    same = next(r for r in rows if r.layout.name == "pp2-mbs2")
    ties = [r.rank for r in rows if r.rank and r.step_s == same.step_s]
    assert plan["asked"]["step_s"] == same.step_s and len(ties) > 1
    assert plan["asked"]["rank"] == min(ties) == 1 + sum(1 for r in rows if r.rank and r.step_s < same.step_s)
    # A layout of the space, asked: its own row, at its own rank among those ties.
    inside = decoders.decoder_plan("llama3-8b", 2, 8, "h100-sxm-8", "torch-compile", 2048, 200, None, 1, "pp2-mbs2")
    assert inside["asked"]["rank"] == same.rank > min(ties)


def test_an_assumed_mfu_is_the_decoder_plan_s_compute_and_a_bare_fsdp_takes_the_devices():
    plan = decoders.decoder_plan("llama3-8b", 2, 8, "h100-sxm-8", "torch-compile", 2048, None, 0.2, 1, "fsdp-mbs1")
    assert plan["basis"] == ("compute ASSUMED: MFU 0.2 of h100-sxm-8's bf16 datasheet peak 989.5 TFLOP/s "
                             "(no measured record)")
    assert plan["asked"]["layout"] == "fsdp2-mbs1"


def test_a_decoder_plan_is_shown_in_tokens_per_device_and_an_asked_layout_outside_it_unranked(monkeypatch):
    """show() on a hand-made decoder plan: its rows' tokens/s per device (not samples/s, which a decoder's row also
    holds), the asked layout that fits nowhere in the top as '-'; bench.plan hands decoder_plan every option."""
    import io

    from rich.console import Console

    from tests.test_plan_cli import _table
    row = {"rank": 1, "layout": "fsdp8-mbs1", "step_s": 1.5, "tokens_per_s_per_device": 12345.4,
           "samples_per_s": 2.5, "memory_per_rank_max": 30 * GIB, "fit": "fits",
           "parts_s": {"comm_exposed": 0.15, "bubble": 0.0, "recompute": 0.3}, "explanation": "the pick"}
    asked = {**row, "rank": 0, "layout": "tp8-mbs1", "fit": "does not fit", "explanation": "too big"}
    plan = {"model": "m", "title": "T", "basis": "B", "rows": [row], "asked": asked, "summary": ["S"]}
    console = Console(file=io.StringIO(), width=300)
    plan_cli.show(console, plan, 3)
    header, body = _table(console.file.getvalue().splitlines())
    assert header[:4] == ["#", "layout", "step (ms)", "tokens/s/device"]
    assert [r[:6] for r in body] == [["1", "fsdp8-mbs1", "1,500", "12,345", "30.00", "fits"],
                                     ["-", "tp8-mbs1", "1,500", "12,345", "30.00", "does not fit"]]
    handed = []
    monkeypatch.setattr(decoders, "decoder_plan", lambda *a: handed.append(a) or {"summary": [], "rows": []})
    plan_cli._decoders(plan_cli.build_parser().parse_args([
        "--model", "llama3-8b", "--devices", "8", "--global-batch", "16", "--hardware", "h100-sxm-8",
        "--stack", "torch-eager", "--seq-len", "4096", "--memory-per-device", "60", "--assume-mfu", "0.4",
        "--top", "7", "--layout", "fsdp8-mbs1"]))
    assert handed == [("llama3-8b", 8, 16, "h100-sxm-8", "torch-eager", 4096, 60.0, 0.4, 7, "fsdp8-mbs1")]
