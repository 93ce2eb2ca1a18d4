"""The published points as data (common/predict/published/*.toml): every file's points parse, every quote holds its
figure as written and, where the quote is a table's row, the point's other fields as that row gives them; each point
the model cannot predict is refused with every reason in one line; and --published's grouping by GPU generation and
publisher, by hand. Unit tests only: no process is started."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest
from matplotlib.collections import PathCollection

from bench.reporting import published_plot
from common.layout import Layout
from common.predict import decoder, published, stacks
from common.predict import hardware as hardware_files
from common.predict.gpu_compute import compute_for

NEW_FILES = {"megatron-lm-a100.toml": 10, "bigscience-bloom-a100.toml": 1, "metaseq-opt-a100.toml": 1,
             "llm-foundry-mpt-a100.toml": 11, "llm-foundry-mpt-h100.toml": 38, "megatron-bridge-h100.toml": 3}


def _points(name: str) -> list[published.Point]:
    return published.load(published.PUBLISHED_DIR / name)


def _cells(quote: str) -> list[str]:
    """A quoted table row's cells (the text before the first '|' is its table's name, or nothing)."""
    return [c.strip() for c in quote.split("|")[1:-1]] if quote.endswith("|") else \
        [c.strip() for c in quote.split(" | ")]


def as_written(point: published.Point) -> list[str]:
    """The ways a source writes the figure: 5762, 5,762, 149.77; an MFU of 0.47 as 47%."""
    forms = {f"{point.published:g}", f"{point.published:,g}"}
    if point.metric == "mfu":
        forms.add(f"{100 * point.published:g}%")
    return sorted(forms)


def test_every_file_s_points_parse_and_every_quote_holds_its_figure_as_written():
    assert set(NEW_FILES) <= {p.name for p in published.PUBLISHED_DIR.glob("*.toml")}
    for name, count in NEW_FILES.items():
        assert len(_points(name)) == count, name
    points = published.all_points()
    assert len({p.name for p in points}) == len(points)                    # names are unique
    assert len({p.source.split(": ")[0] for p in points}) >= 5
    assert {published.generation(p.hardware) for p in points} >= {"A100", "H100"}
    for p in points:
        spec = decoder.load(p.model, p.seq_len)                              # the model and hardware exist
        hardware_files.load(p.hardware)
        assert p.devices >= 1 and p.global_batch >= 1 and p.published > 0 and p.quote and spec.layers
        assert any(re.search(rf"(?<![\d.,]){re.escape(f)}(?![\d.]|,\d)", p.quote) for f in as_written(p)), \
            (p.name, as_written(p), p.quote)


def test_a_table_row_s_other_cells_are_the_point_s_fields():
    # llm-foundry: # GPUs, MicroBatchSize, GlobalBatchSize, Throughput (T/s/GPU), and NumParams the model's count
    for p in _points("llm-foundry-mpt-a100.toml") + _points("llm-foundry-mpt-h100.toml"):
        cells = _cells(p.quote)
        model, seq, gpus, mbs, gbs, per_gpu, shard, recompute, params = (cells[i] for i in (0, 1, 2, 7, 9, 12, 16,
                                                                                              17, 19))
        assert (p.model, int(seq), int(gpus), p.global_batch, int(per_gpu)) == \
            (f"mpt-{model}", 2048, p.devices, int(gbs), p.published), p.name
        layout = Layout.parse(p.layout, p.devices)
        assert (layout.micro_batch_size, layout.recompute == "full") == (int(mbs), recompute == "True"), p.name
        assert (layout.fsdp, layout.zero2) == (p.devices, shard == "SHARD_GRAD_OP"), p.name
        assert decoder.load(p.model).param_count() == int(params), p.name
    # Megatron-LM's A100 table: hidden, layers, parameters (billions), TP x PP, GPUs, batch, teraFLOP/s per GPU
    for p in _points("megatron-lm-a100.toml"):
        size, hidden, layers, billions, mp, gpus, batch, tflops = _cells(p.quote)[:8]
        spec, layout = decoder.load(p.model), Layout.parse(p.layout, p.devices)
        assert (spec.hidden, spec.layers, round(spec.param_count() / 1e9, 1)) == (int(hidden), int(layers),
                                                                                   float(billions)), p.name
        assert (layout.tp * layout.pp, p.devices, p.global_batch, p.published) == \
            (int(mp), int(gpus), int(batch), float(tflops)), p.name
    # Megatron-Bridge: #-GPUs, GBS, MBS, TP, PP, CP, VP, Tokens / sec / GPU
    for p in _points("megatron-bridge-h100.toml"):
        _, gpus, precision, gbs, mbs, seq, fsdp, tp, pp, cp, vp, _, _, per_gpu, _ = _cells(p.quote)
        layout = Layout.parse(p.layout, p.devices)
        assert (p.devices, p.global_batch, int(seq), precision, p.stack) == \
            (int(gpus), int(gbs), 8192, "FP8-CS", "megatron-bridge-fp8-cs"), p.name
        assert (layout.tp, layout.pp, layout.cp, layout.micro_batch_size, p.published) == \
            (int(tp), int(pp), int(cp), int(mbs), int(per_gpu)), p.name
        assert (layout.virtual_stages if vp != "n/a" else "n/a", layout.fsdp > 1) == \
            (int(vp) if vp != "n/a" else "n/a", fsdp != "0"), p.name


def test_bloom_s_logged_teraflops_are_its_step_time_counted_as_megatron_deepspeed_counts():
    (point,) = _points("bigscience-bloom-a100.toml")
    spec = decoder.load(point.model)
    assert spec.layer_params() == 2_466_437_120 and spec.vocab * spec.hidden == 3_596_615_680   # its README
    # "elapsed time per iteration (s): 104.70 | ... | TFLOPs: 149.77" in the same log line
    assert published.metric_of(point, spec, 104.70) == pytest.approx(149.77, rel=1e-4)
    no_recompute = replace(point, layout=point.layout.replace("-rc", ""))
    assert published.metric_of(no_recompute, spec, 104.70) == pytest.approx(149.77 * 3 / 4, rel=1e-4)


def test_each_point_the_model_cannot_predict_is_refused_with_every_reason_in_one_line():
    result = published.check()
    rows = {r["name"]: r for r in result["points"]}
    for p in published.all_points():
        why, row = published.refusal(p), rows[p.name]
        assert "\n" not in why and (row["refused"] if why else row["predicted"]) and row.get("refused", "") == why
        if p.stack not in stacks.STACKS:
            assert f"stack {p.stack!r} is not described" in why
        if not hardware_files.load(p.hardware).compute:
            assert f"--hardware {p.hardware}: no compute table" in why and "assume-mfu" not in why
        if re.search(r"-fp8\b", p.layout):
            assert "fp8 is the software's, not the layout's" in why
        if p.metric != "tokens_per_s_per_gpu" and p.flops not in published.FLOP_COUNTS:
            assert "FLOP count is not known" in why
    assert rows["OPT-175B, 992 A100"]["refused"].count("; ") == 2             # stack, table, FLOP count
    assert all(rows[p.name]["predicted"] for name in ("megatron-lm-h100.toml", "torchtitan-llama3-h100.toml")
               for p in _points(name) if p.stack != "torch-compile-float8")     # the 15 predicted before
    assert result["predicted"] + result["refused"] == len(rows)
    # a device's compute comes from compute_of: given one, an A100 point of a described stack is predicted
    point = next(p for p in published.all_points() if p.stack == "megatron-te")
    h100 = compute_for(hardware_files.load("h100-sxm-8"))
    moved = replace(point, hardware="a100-sxm-8")
    assert "no compute table" in published.predict_point(moved)["refused"]
    assert published.predict_point(moved, lambda _hw: h100)["predicted"] > 0


def test_llm_foundry_s_points_are_predicted_where_their_attention_has_a_rate_and_refused_for_it_else():
    """Each row's stack is the attention its runs took: the H100 large-scale table's sweep.py (5e85bd62d4ec) passes
    --attn_impl flash for 1b, 3b, 7b and 70b and triton for 13b and 30b; the other tables' sweep.sh (b2a43a1477a4)
    none, submit_benchmarks.py's default triton; the A100 table's 70B rows are older runs in PURE bf16. The twelve
    rows that ran flash are predicted (six FULL_SHARD, six SHARD_GRAD_OP: ZeRO-2), and the 26 others that ran
    MPT's Triton attention are refused for its rate alone, in one line."""
    h100, a100 = _points("llm-foundry-mpt-h100.toml"), _points("llm-foundry-mpt-a100.toml")
    for p in h100:
        flash = p.quote.startswith("H100 80GB BF16 (Large Scale") and p.model in ("mpt-1b", "mpt-3b", "mpt-7b",
                                                                                  "mpt-70b")
        assert p.stack == ("llm-foundry" if flash else "llm-foundry-triton"), p.name
    for p in a100:
        assert p.stack == ("llm-foundry-triton-pure" if "| bf16 | PURE |" in p.quote else "llm-foundry-triton")
    rows = [published.predict_point(p) for p in h100]
    assert sorted(r["name"] for r in rows if r["predicted"] is not None) == sorted(
        f"llm-foundry MPT-{size}, {n} H100" for size in ("70B", "7B", "3B", "1B") for n in (512, 256, 128))
    kernel = ("h100-sxm: no rate of the attention kernel llm-foundry-triton runs ('mpt_triton'; the table has "
              "torch_flash, torch_cudnn, fa2, cudnn)")
    assert sum(r.get("refused") == kernel for r in rows) == 26 == len(rows) - 12
    # the rate is all a triton point lacks: a table that has one (here fa2's, for the mechanics only) predicts it
    h100_table = compute_for(hardware_files.load("h100-sxm-8"))
    rated = replace(h100_table, attention={**h100_table.attention, "mpt_triton": h100_table.attention["fa2"]})
    triton = next(p for p in h100 if p.stack == "llm-foundry-triton")
    assert published.refusal(triton, lambda _hw: rated) == "" and \
        published.predict_point(triton, lambda _hw: rated)["predicted"] > 0


def test_the_decoder_format_takes_relu_and_alibi(tmp_path):
    opt, bloom, gpt = decoder.load("opt-175b"), decoder.load("bloom-176b"), decoder.load("gpt3-175b")
    assert (opt.ffn_kind, opt.position, bloom.position) == ("relu", "learned", "alibi")
    assert bloom.embedding_params() == bloom.vocab * bloom.hidden               # ALiBi: no position table
    relu = replace(gpt, ffn_kind="relu")                                         # a ReLU FFN moves GELU's bytes
    assert relu.stored_activation_bytes(4096) == gpt.stored_activation_bytes(4096)
    assert stacks.load("megatron-te").elementwise(relu) == stacks.load("megatron-te").elementwise(gpt)
    bad = tmp_path / "m.toml"
    bad.write_text(decoder.MODELS_DIR.joinpath("opt-175b.toml").read_text().replace('"learned"', '"sinusoidal"'))
    with pytest.raises(ValueError, match=r"position 'sinusoidal' \(learned\|rope\|alibi\)"):
        decoder.load(str(bad))


def _row(name, generation, publisher, error=None, worst=None):
    row = {"name": name, "generation": generation, "publisher": publisher, "metric": "tflops_per_gpu", "devices": 8,
           "published": 100.0,
           "predicted": None if error is None else 100.0 * (1 + error), "error": error, "stack": "s",
           "layout_full": "dp8"}
    if error is None:
        row["refused"] = "why"
    elif worst is not None:
        row["worst_error"], row["error_by_table"] = worst, {"t": worst}
    return row


def test_the_points_are_grouped_by_gpu_generation_and_publisher_by_hand():
    assert [published.generation(h) for h in ("a100-sxm-8", "h100-sxm-8", "h100-96gb-500w-8",
                                               "cpu-loopback-2core")] == ["A100", "H100", "H100",
                                                                           "cpu-loopback-2core"]
    rows = [_row("a", "H100", "P", 0.10, worst=-0.30), _row("b", "A100", "Q", -0.20), _row("c", "H100", "Q", 0.04),
            _row("d", "A100", "P"), _row("e", "H100", "P", -0.06, worst=0.08)]
    groups = {(g["by"], g["group"]): g for g in published.groups(rows)}
    assert list(groups) == [("generation", "A100"), ("generation", "H100"), ("publisher", "P"),
                            ("publisher", "Q")]
    assert groups["generation", "A100"] == {
        "by": "generation", "group": "A100", "predicted": 1, "refused": 1, "median_abs_error": 0.20,
        "max_abs_error": 0.20, "worst_median_abs_error": 0.20, "worst_max_abs_error": 0.20}
    h100, p = groups["generation", "H100"], groups["publisher", "P"]
    assert (h100["predicted"], h100["refused"]) == (3, 0)
    assert h100["median_abs_error"] == pytest.approx(0.06) and h100["max_abs_error"] == pytest.approx(0.10)
    assert h100["worst_median_abs_error"] == pytest.approx(0.08) and h100["worst_max_abs_error"] == 0.30
    assert (p["predicted"], p["refused"], p["median_abs_error"], p["max_abs_error"]) == (2, 1, 0.08, 0.10)
    assert published.groups([_row("d", "A100", "P")])[0]["median_abs_error"] is None
    # the table: generation, then publisher, the file's order within; the group table and its lines
    result = {"points": rows, "groups": published.groups(rows)}
    assert [r[:3] for r in published_plot.rows(result)] == [["A100", "Q", "b"], ["H100", "P", "a"],
                                                           ["H100", "P", "e"], ["H100", "Q", "c"]]
    assert published_plot.refused_rows(result) == [["A100", "P", "d", "tflops_per_gpu", "100", "why"]]
    assert published_plot.group_rows(result)[0] == ["generation", "A100", "1", "1", "20.0%", "20.0%", "20.0%",
                                                    "20.0%"]
    assert published_plot.group_line(groups["publisher", "Q"]).startswith("Q: 2 predicted, 0 refused; median")
    assert published_plot.group_line({"group": "R", "predicted": 0, "refused": 2}) == "R: 0 predicted, 2 refused"
    # the figure: one colour a generation
    plot = published_plot.published_plot({**result, **published.error_summary(rows)})
    colours = [tuple(c.get_facecolor()[0]) for ax in plot.figure.axes for c in ax.collections
               if isinstance(c, PathCollection)]
    assert len(colours) == 4 and len(set(colours)) == 2                  # b (A100); a, c, e (H100)


def _slow_h100(device: str, matmul: dict) -> dict:
    """A bench.compute_table measurement of a made-up slow part: every bf16 GEMM at 10 TFLOP/s."""
    return {"device": device, "software": "torch", "date": "2026-11-28", "launch_us": {"eager": 5.0, "graph": 2.0},
            "copy_GBps": {str(1 << 30): 3000.0}, "matmul": matmul, "attention": {}}


def test_each_measured_table_replaces_only_what_it_measured_and_the_worst_error_is_the_largest_in_size(tmp_path):
    import json

    h100 = hardware_files.load("h100-sxm-8")
    device = "NVIDIA H100 80GB HBM3"
    grid = [[m, n, k, 10.0] for m in (256, 16384) for n in (256, 16384) for k in (256, 16384)]
    (tmp_path / "x" / "compute").mkdir(parents=True, exist_ok=True)
    for name, measured in (("slow", _slow_h100(device, {"bf16": {"grid": grid}})),
                           ("other-part", _slow_h100("NVIDIA A100-SXM4-80GB", {"bf16": {"grid": grid}})),
                           ("fp8-only", _slow_h100(device, {"fp8": {"grid": grid}}))):
        (tmp_path / "x" / "compute" / f"{name}.json").write_text(json.dumps(measured))
    tables = published.measured_tables(h100, tmp_path)
    assert list(tables) == ["x/compute/slow.json"]          # of this part, with bf16 GEMMs
    slow, bundled = tables["x/compute/slow.json"], compute_for(h100)
    assert set(slow.matmul["bf16"].tflops.values()) == {10.0}
    assert slow.matmul["fp8"] == bundled.matmul["fp8"] and slow.attention == bundled.attention   # kept
    assert slow.matmul["bf16"].source.endswith("2026-11-28: x/compute/slow.json: C[m, n] = A[m, k] B[k, n], "
                                               "row-major operands, median of 5 batches")
    # a point predicted from the slow table: far below the published figure; its worst error is that one
    point = next(p for p in published.all_points() if p.name == "megatron GPT-3 177B strong scaling, 96 H100")
    result = published.check([point], reference=tmp_path)
    row = result["points"][0]
    assert row["error_by_table"]["x/compute/slow.json"] < -0.5 < row["error"]
    assert row["worst_error"] == row["error_by_table"]["x/compute/slow.json"]
    assert result["rankings"] == published.rankings(result["points"]) == []           # one point: no pair
    assert result["groups"] == published.groups(result["points"]) and len(result["groups"]) == 2
    assert result["tables"] == {"h100-sxm-8": ["x/compute/slow.json"]}
    assert slow.path == "x/compute/slow.json"


def test_a_measured_table_takes_the_kernels_it_measured_over_a_bundled_table_that_has_none(tmp_path):
    import json

    table = tmp_path / "bare.toml"           # a part's table that holds no GEMM and no attention yet
    table.write_text('name = "bare"\ndevice = "NVIDIA X"\nlaunch_floor_us = 3\n')
    hw = tmp_path / "x.toml"
    hw.write_text(f'name = "x"\ndevice_kind = "cuda"\ndevice_name = "NVIDIA X"\ndevices_per_node = 8\n'
                  f'memory_GiB = 80\nmemory_GBps = 2000\ncompute = "{table}"\n[[link]]\nlevel = "node"\n'
                  'busbw_GBps = 100\nlatency_us = 3\n')
    grid = [[256, 256, 256, 10.0]]
    attention = {"torch_flash": {"forward_causal": [[512, 1.5]], "backward": [[512, 2.5]]}}
    (tmp_path / "r" / "x" / "compute").mkdir(parents=True, exist_ok=True)
    for name, kernels in (("a", attention), ("b", {})):
        (tmp_path / "r" / "x" / "compute" / f"{name}.json").write_text(json.dumps(
            {**_slow_h100("NVIDIA X", {"bf16": {"grid": grid}}), "attention": kernels}))
    tables = published.measured_tables(hardware_files.load(str(hw)), tmp_path / "r")
    a, b = tables["x/compute/a.json"], tables["x/compute/b.json"]
    assert (list(a.matmul), a.matmul["bf16"].tflops, a.launch_floor_s) == (["bf16"], {(256, 256, 256): 10.0}, 2e-6)
    assert (a.attention["torch_flash"].forward_causal, a.attention["torch_flash"].backward) == (((512, 1.5),),
                                                                                              ((512, 2.5),))
    assert b.attention == {} and list(b.matmul) == ["bf16"]


def test_a_point_without_a_flop_count_anywhere_has_none_and_the_gemm_shapes_are_of_the_points_given(tmp_path,
                                                                                                    monkeypatch):
    path = tmp_path / "p.toml"
    path.write_text('[source]\npublisher = "P"\nwhere = "page 3"\nhardware = "h100-sxm-8"\nstack = "megatron-te"\n'
                    '[[point]]\nname = "a"\nmodel = "llama3-8b"\ndevices = 8\nlayout = "fsdp8"\nglobal_batch = 16\n'
                    'metric = "tflops_per_gpu"\npublished = 400\nquote = "| 400 |"\n')
    (point,) = published.load(path)
    assert point.flops == ""
    assert published.refusal(point).endswith("tflops_per_gpu: its publisher's FLOP count is not known (flops = '')")
    assert published.gemm_shapes([]) == []
    one = next(p for p in published.all_points() if p.layout == "fsdp8-mbs2-sel")
    monkeypatch.setattr(published, "all_points", lambda: [one])
    assert published.gemm_shapes() == published.gemm_shapes([one]) and (16384, 4096, 4096) in published.gemm_shapes()


def test_the_gemm_shapes_of_a_thin_model_leave_out_the_empty_ones_by_hand(tmp_path):
    # 8 heads of width 1, one KV head: at tp 2 a rank's K and V projections have no column (n = 1 // 2 = 0)
    model = tmp_path / "thin.toml"
    model.write_text('name = "thin"\nlayers = 2\nhidden = 8\nheads = 8\nkv_heads = 1\nffn = 16\nffn_kind = "swiglu"\n'
                     'vocab = 32\nseq_len = 16\ntied_embeddings = false\n')
    point = published.Point("t", str(model), 2, "tp2-sp", 2, "tokens_per_s_per_gpu", 1.0, "", "h100-sxm-8",
                            "torch-eager", "", "P: x")
    # 32 tokens: wq (32, 4, 8), wo (32, 8, 4), w1, w3 and w2 (32, 8, 8), the output (32, 32, 8); each one's dgrad
    # (m, k, n) and wgrad (k, n, m)
    assert published.gemm_shapes([point]) == [(4, 8, 32), (8, 4, 32), (8, 8, 32), (8, 32, 32), (32, 4, 8),
                                              (32, 8, 4), (32, 8, 8), (32, 8, 32), (32, 32, 8)]
    whole = replace(point, devices=1, layout="fsdp")             # one device: K and V one column each
    assert (32, 1, 8) in published.gemm_shapes([whole])


def test_a_row_of_the_published_table_is_the_point_its_prediction_and_its_parts():
    from common.predict.step import predict

    point = published.Point("x", "megatron-gpt-177b", 96, "tp8xpp6-mbs1", 1152, "tflops_per_gpu", 100.0, "| q |",
                            "h100-sxm-8", "megatron-te", "megatron", "Meta AI: page 3: table 1", seq_len=1024,
                            assumed="mbs")
    row = published.predict_point(point)
    spec, layout, hw = decoder.load(point.model, 1024), Layout.parse(point.layout, 96), hardware_files.load(
        "h100-sxm-8")
    p = predict(spec, layout, 1152, hw, compute_for(hw), stack=stacks.load("megatron-te"))
    predicted = published.metric_of(point, spec, p.step_s)
    assert row == {"name": "x", "source": "Meta AI: page 3: table 1", "metric": "tflops_per_gpu", "published": 100.0,
                   "model": "megatron-gpt-177b", "devices": 96, "layout": "tp8xpp6-mbs1", "hardware": "h100-sxm-8",
                   "stack": "megatron-te", "global_batch": 1152, "quote": "| q |", "assumed": "mbs",
                   "generation": "H100", "publisher": "Meta AI", "layout_full": layout.name, "predicted": predicted,
                   "error": predicted / 100.0 - 1, "step_s": p.step_s, "parts_s": p.parts_s,
                   "memory_per_rank": p.memory_max}
    assert p.step_s != predict(decoder.load(point.model), layout, 1152, hw, compute_for(hw),
                               stack=stacks.load("megatron-te")).step_s          # its own sequence, not the model's
    # refused by the step model itself (refusal() finds nothing): its words, no figure
    tp5 = replace(point, model="llama3-8b", devices=5, layout="tp5-vocab", global_batch=5, seq_len=None)
    assert published.refusal(tp5) == ""
    refused = published.predict_point(tp5)
    assert (refused["predicted"], refused["error"], refused["refused"]) == (
        None, None, "tp5-vocab: llama3-8b's 32 heads and FFN 14336 must divide by tp 5")
    assert "step_s" not in refused and refused["publisher"] == "Meta AI"
    # refused before: a device without a compute table, as refusal() words it, given the compute_of that refuses
    a100 = replace(point, hardware="a100-sxm-8")
    assert published.predict_point(a100)["refused"] == published.refusal(a100) == \
        "--hardware a100-sxm-8: no compute table"


def test_each_publisher_s_flop_count_by_hand():
    gpt, llama = decoder.load("megatron-gpt-177b"), decoder.load("llama3-8b")
    s, h, L, f, V = gpt.seq_len, gpt.hidden, gpt.layers, gpt.ffn, gpt.vocab
    assert gpt.ffn_kind == "gelu" and llama.ffn_kind == "swiglu"
    # Megatron's: a GELU FFN's two matrices counted as they are (q width = hidden, 96 heads of 96)
    assert published.megatron_flops(gpt, 2) == pytest.approx(
        12 * 2 * s * L * h * h * ((1 + 1 + s / h) + f / h + V / (2 * L * h)), rel=1e-12)
    # Narayanan et al.'s: 24 for a GELU model, 32 for a GLU one; 4 passes with recomputation, else 3
    s, h, L, V = llama.seq_len, llama.hidden, llama.layers, llama.vocab
    assert published.megatron_2021_flops(llama, 2, False) == pytest.approx(
        32 * 3 * 2 * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)), rel=1e-12)
    point = published.Point("x", "megatron-gpt-177b", 8, "tp4xdp-rc", 16, "tflops_per_gpu", 1.0, "", "h100-sxm-8",
                            "megatron-te", "megatron-2021", "")
    assert published.metric_of(point, gpt, 2.0) == published.megatron_2021_flops(gpt, 16, True) / 2.0 / 8 / 1e12
    assert published.metric_of(replace(point, flops="megatron"), gpt, 2.0) == \
        published.megatron_flops(gpt, 16) / 2.0 / 8 / 1e12
    with pytest.raises(ValueError, match=r"^x: tflops_per_gpu needs the publisher's FLOP formula \(flops = "
                                         r"'megatron' or 'megatron-2021'\)$"):
        published.metric_of(replace(point, flops="palm"), gpt, 2.0)


def test_a_refusal_gives_every_reason_in_its_own_words_in_one_line():
    point = published.Point("x", "llama3-8b", 8, "tp3", 8, "mfu", 0.5, "", "a100-sxm-8", "deepspeed", "palm", "P: w")
    assert published.refusal(point) == (
        "'tp3' at 8 devices: the other dimensions (3) do not divide them; "
        "stack 'deepspeed' is not described (common/predict/stacks.py describes megatron-te, torch-eager, "
        "torch-compile, torch-compile-float8, llm-foundry, llm-foundry-triton, megatron-bridge-fp8-cs, olmo-core, "
        "olmo-core-float8); "
        "--hardware a100-sxm-8: no compute table; "                       # the advice after " (" left out
        "mfu: its publisher's FLOP count is not known (flops = 'palm')")
    # a layout the grammar takes, at the point's own device count, that its described stack does not run
    megatron = replace(point, layout="fsdp", hardware="h100-sxm-8", stack="megatron-te", flops="megatron")
    assert published.refusal(megatron) == (
        "fsdp8: megatron-te does not run it: Megatron-LM core_r0.8.0 shards no parameters (its arguments have no "
        "FSDP; the distributed optimizer shards the optimizer state: zero1)")
    assert published.refusal(replace(megatron, layout="tp8")) == ""
    # a stack not described, on a device with a table: refused for the stack alone, its attention kernel not sought
    assert published.refusal(replace(megatron, layout="tp8", stack="deepspeed")) == (
        "stack 'deepspeed' is not described (common/predict/stacks.py describes megatron-te, torch-eager, "
        "torch-compile, torch-compile-float8, llm-foundry, llm-foundry-triton, megatron-bridge-fp8-cs, olmo-core, "
        "olmo-core-float8)")


def test_a_ranking_row_by_hand():
    rows = [{"name": n, "model": "m", "hardware": "h", "devices": 8, "metric": "x", "published": pub, "predicted": pr}
            for n, pub, pr in (("a", 100, 5), ("b", 105, 4), ("c", 150, 9))]
    # ranks of the predicted 2, 1, 3 against 1, 2, 3: 1 - 6 x (1 + 1) / (3 x 8) = 0.5
    assert published.rankings(rows + [{**rows[0], "name": "alone", "devices": 16}, {**rows[1], "predicted": None}]) \
        == [{"model": "m", "hardware": "h", "devices": 8, "points": ["a", "b", "c"], "spearman": pytest.approx(0.5),
             "pairs": [{"a": "a", "b": "b", "apart": False, "agrees": False},
                       {"a": "a", "b": "c", "apart": True, "agrees": True},
                       {"a": "b", "b": "c", "apart": True, "agrees": True}], "order_holds": True}]


def test_pairs_of_two_points_are_ranked_and_a_tie_in_the_prediction_does_not_agree():
    def row(name, model, published_, predicted):
        return {"name": name, "model": model, "hardware": "h", "devices": 8, "metric": "x", "published": published_,
                "predicted": predicted}
    rows = [row("solo", "z", 1.0, 1.0),                                  # a group of one: skipped, not the end
            row("a", "n", 1.0, 2.0), row("b", "n", 1.5, 2.0),           # predicted alike: no order, no agreement
            row("c", "q", 1.0, 1.0), row("d", "q", 1.5, 2.0)]           # (1.0 - 1.5) x (1.0 - 2.0) = 0.5 > 0
    n, q = published.rankings(rows)
    assert (n["points"], n["pairs"], n["order_holds"]) == (
        ["a", "b"], [{"a": "a", "b": "b", "apart": True, "agrees": False}], False)
    assert (q["points"], q["pairs"][0]["agrees"], q["order_holds"]) == (["c", "d"], True, True)
