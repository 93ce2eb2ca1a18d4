"""bench.predict at LLM scale (common/predict/decoder.py, common/layout.py, gpu_compute.py, kernels.py, step.py,
published.py): the formulas against hand counts and the papers' closed forms, the published points as data,
and refusals in one line. Unit tests only: no process is started."""
from __future__ import annotations

import json
import re
from dataclasses import fields, replace
from pathlib import Path

import pytest

from bench import predict as predict_cli
from bench.reporting.published_plot import published_blocks
from common.layout import Layout, Refused
from common.predict import constants, decoder, published, stacks
from common.predict import hardware as hardware_files
from common.predict.gpu_compute import compute_for
from common.predict.kernels import device_compute
from common.predict.step import pipeline_s, predict
from common.spec import Gemm
from common.stats import spearman
from tests.test_compute_table import _hardware

GPT = decoder.load("megatron-gpt-177b")     # h 12288, 96 heads, s 4096, GELU 4h, biases, untied
LLAMA = decoder.load("llama3-8b")           # h 4096, 32 heads, 8 KV heads, SwiGLU 14336, no biases


# ----------------------------------------------------------------------------- one GPT and one Llama layer

def test_gpt_layer_parameters_flops_and_gemms_by_hand():
    h = GPT.hidden
    # Q, K, V, output: 4h^2 + 4h biases; FFN 8h^2 + 5h; two LayerNorms 4h: 12h^2 + 13h.
    assert GPT.layer_params() == 12 * h * h + 13 * h
    assert sum(g.flops for g in GPT.gemms(1)) / GPT.seq_len == 2 * (GPT.layers * 12 * h * h + h * GPT.vocab)
    # Under tp 8 with Megatron's fused QKV: [T, h] x [h, 3h/8], [T, h/8] x [h/8, h], fc1 [h, 4h/8], fc2 [4h/8, h].
    shapes = [(g.m, g.n, g.k) for g in GPT.layer_gemms(4096, tp=8, fused=True)]
    assert shapes == [(4096, 3 * h // 8, h), (4096, h, h // 8), (4096, 4 * h // 8, h), (4096, h, 4 * h // 8)]
    dgrad, wgrad = decoder.DecoderSpec.backward_gemms(Gemm("w", 4096, 1536, 12288))
    assert (dgrad.m, dgrad.n, dgrad.k) == (4096, 12288, 1536) and (wgrad.m, wgrad.n, wgrad.k) == (12288, 1536, 4096)
    # a sequence's multiply-adds (a pipeline stage's cost), whole numbers: a layer's GEMMs 12h^2 a token and causal
    # attention's two products h s / 2 a token each; the head h V a token
    s = GPT.seq_len
    for macs, by_hand in ((GPT.layer_forward_macs(), s * 12 * h * h + s * s * h),
                          (GPT.head_forward_macs(), s * h * GPT.vocab)):
        assert type(macs) is int and macs == by_hand


def test_gpt_training_flops_are_narayanans_and_megatrons_count():
    # Narayanan et al. 2021 (eq. 3 without recomputation): 72 B s l h^2 (1 + s / 6h) + 6 B s h V per step, which
    # is also Megatron's num_floating_point_operations for a GPT with a 4h FFN; both count full attention.
    s, h, L, V = GPT.seq_len, GPT.hidden, GPT.layers, GPT.vocab
    narayanan = 72 * s * L * h * h * (1 + s / (6 * h)) + 6 * s * h * V
    ours = 3 * (sum(g.flops for g in GPT.gemms(1)) + GPT.attention_flops(1, causal=False))
    assert ours == pytest.approx(narayanan, rel=1e-12)
    assert published.megatron_flops(GPT, 1) == pytest.approx(narayanan, rel=1e-12)
    assert GPT.attention_flops(1, causal=True) / GPT.seq_len == GPT.attention_flops(1, causal=False) / GPT.seq_len / 2


def test_gpt_activations_are_korthikantis_closed_forms():
    # Korthikanti et al. 2022, section 4: sbh(34 + 5as/h) bytes per layer; with tp t sbh(10 + 24/t + 5as/(ht));
    # with sequence parallelism sbh(34/t + 5as/(ht)); flash attention keeps no s x s scores.
    s, h, a, b = GPT.seq_len, GPT.hidden, GPT.heads, 2
    kept = GPT.stored_activation_bytes
    assert kept(b * s, flash=False, dropout=True) == pytest.approx(s * b * h * (34 + 5 * a * s / h))
    assert kept(b * s, tp=8, flash=False, dropout=True) == \
        pytest.approx(s * b * h * (10 + 24 / 8 + 5 * a * s / (h * 8)))
    assert kept(b * s, tp=8, sequence_parallel=True, flash=False, dropout=True) == \
        pytest.approx(s * b * h * (34 / 8 + 5 * a * s / (h * 8)))
    assert kept(b * s, tp=8, sequence_parallel=True, dropout=True) == \
        pytest.approx(s * b * h * 34 / 8 + 4 * b * s * a / 8)   # + the log-sum-exp, float32 per head


def test_llama_layer_by_hand_and_the_published_parameter_counts():
    h, kv, f = LLAMA.hidden, LLAMA.kv_width, LLAMA.ffn
    assert kv == 8 * 128
    # Q and O h x h, K and V h x 1024 (GQA), gate, up and down h x f, two RMSNorm weights.
    assert LLAMA.layer_params() == 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h
    # The Llama 3 models' parameter counts (Hugging Face's meta-llama checkpoints), and Megatron's table's sizes.
    assert [decoder.load(n).param_count() for n in ("llama3-8b", "llama3-70b", "llama3-405b")] == \
        [8_030_261_248, 70_553_706_496, 405_853_388_800]
    table = {"1.7b": 1.7, "7.1b": 7.1, "16b": 16, "32b": 32, "70b": 70, "119b": 119, "177b": 177, "314b": 314,
             "462b": 462}
    for name, billions in table.items():   # the table rounds (and writes 1.75B as 1.7B)
        assert decoder.load(f"megatron-gpt-{name}").param_count() / 1e9 == pytest.approx(billions, rel=0.035)
    # SwiGLU under tp 2 unfused (torchtitan): wq, wk, wv, wo, w1, w3, w2 at their own shapes.
    assert [(g.name, g.n, g.k) for g in LLAMA.layer_gemms(16384, tp=2)] == [
        ("wq", h // 2, h), ("wk", kv // 2, h), ("wv", kv // 2, h), ("wo", h, h // 2), ("w1", f // 2, h),
        ("w3", f // 2, h), ("w2", h, f // 2)]
    # The spec keeps these once worked out; a copy with another FFN works its own out.
    wide = replace(LLAMA, ffn=2 * f)
    assert wide.layer_params() - LLAMA.layer_params() == wide.linear_weights() - LLAMA.linear_weights() == 3 * h * f
    assert [g.n for g in wide.layer_gemms(16384, tp=2)][4:6] == [f, f]
    assert [g.n for g in LLAMA.layer_gemms(16384, tp=2)][4:6] == [f // 2, f // 2]


def test_olmo_core_s_models_have_the_parameters_its_own_formula_counts():
    """OLMo-core's TransformerConfig.num_params (nn/transformer/config.py at e27ba7455) worked by hand: the
    embedding and the untied w_out d x V each; a block's Q and O d x d, K and V d x (kv heads x head dim), QK-norm's
    weights over d and the K width, the two norms' d, the SwiGLU's 3 x d x hidden; the final norm's d."""
    def num_params(d, layers, kv_width, hidden, qk_norm, vocab=100_352):
        block = 2 * d * d + 2 * d * kv_width + (d + kv_width if qk_norm else 0) + 2 * d + 3 * d * hidden
        return 2 * d * vocab + layers * block + d
    assert decoder.load("olmo2-7b").param_count() == num_params(4096, 32, 4096, 11008, True) == 7_298_617_344
    assert decoder.load("olmo2-1b").param_count() == num_params(2048, 18, 2048, 5632, True)
    assert decoder.load("olmo2-13b").param_count() == num_params(5120, 40, 5120, 13824, True)
    assert decoder.load("olmo-core-llama3-8b").param_count() == num_params(4096, 32, 1024, 14336, False)
    # the same model as Llama 3 8B but for the vocabulary: 100,352 rows of dolma2 instead of 128,256
    assert decoder.load("olmo-core-llama3-8b").param_count() == LLAMA.param_count() - 2 * 4096 * (128_256 - 100_352)
    # QK-norm's weights: one per element of Q and of K (GQA: K narrower), a LayerNorm's a bias beside each
    gqa = replace(LLAMA, qk_norm=True)
    assert (gqa.qk_norm_params(), replace(gqa, norm="layernorm").qk_norm_params()) == (4096 + 1024, 2 * (4096 + 1024))
    assert gqa.layer_params() - LLAMA.layer_params() == 4096 + 1024 and LLAMA.qk_norm_params() == 0
    # and its inputs kept for the backward, bf16, Q's and K's split over tensor parallelism
    assert gqa.stored_activation_bytes(8, tp=2) - LLAMA.stored_activation_bytes(8, tp=2) == 8 * 2 * (4096 + 1024) / 2


def test_a_bad_model_file_is_one_line(tmp_path):
    bad = tmp_path / "m.toml"
    bad.write_text('name = "m"\nlayers = 2\nhidden = 64\nheads = 3\nkv_heads = 1\nffn = 128\nffn_kind = "geglu"\n'
                   'vocab = 10\nseq_len = 8\ntied_embeddings = true\n')
    with pytest.raises(ValueError, match="ffn_kind 'geglu'.*do not divide") as err:
        decoder.load(str(bad))
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- compute and layouts

def test_gemm_rates_come_from_the_table_interpolated_in_log_space():
    c = compute_for(hardware_files.load("h100-sxm-8"))
    table = c.matmul["bf16"]
    assert table.rate(4096, 4096, 4096) == table.tflops[(4096, 4096, 4096)]
    between = table.rate(4096, 4096, 2896.3)   # half-way in log2 between k = 2048 and 4096
    assert between == pytest.approx((table.tflops[(4096, 4096, 2048)] + table.tflops[(4096, 4096, 4096)]) / 2,
                                    rel=1e-3)
    edge = tuple(axis[-1] for axis in table.grid)
    assert table.rate(2 * edge[0], 3 * edge[1], 4 * edge[2]) == table.tflops[edge]  # the edge beyond the grid
    g = Gemm("x", 4096, 4096, 4096)
    assert c.gemm_s(g) == pytest.approx(g.flops / (table.tflops[(4096, 4096, 4096)] * 1e12))
    assert c.gemm_s(Gemm("tiny", 1, 1, 1)) == c.launch_floor_s


def test_interleaving_shrinks_the_bubble_by_the_chunks():
    e, p, m, v = 2.0, 4, 8, 2
    assert pipeline_s([e] * p, m, v) == pytest.approx((m + (p - 1) / v) * e)
    spec, hw = decoder.load("megatron-gpt-70b"), hardware_files.load("h100-sxm-8")
    c, meg = compute_for(hw), stacks.load("megatron-te")
    plain = predict(spec, Layout.parse("tp8xpp4-sp-zero1-mbs1-1f1b-vocab", 32), 32, hw, c, stack=meg)
    chunked = predict(spec, Layout.parse("tp8xpp4-sp-zero1-vp3-mbs1-vocab", 32), 32, hw, c, stack=meg)
    assert chunked.bubble_s < plain.bubble_s
    assert chunked.compute_s == pytest.approx(plain.compute_s)


def test_layout_names_and_refusals_are_one_line():
    assert Layout.parse("tp8xpp6xdp-sp-zero1-vp2-tpo-mbs1", 2304) == Layout(
        dp=48, tp=8, pp=6, sp=True, zero1=True, schedule="interleaved", virtual_stages=2, tp_overlap=True,
        micro_batch_size=1)
    assert Layout.parse("dp2xfsdp4-sel", 8) == Layout(dp=2, fsdp=4, recompute="selective")
    assert Layout.parse("tp8xpp4", 64).dp == 2
    for name, why in (("fsdp-fp8", "fp8 is the software's, not the layout's"), ("tp2xep4", "expert parallelism"),
                      ("fsdp-zero3", "unknown option 'zero3'"), ("tp8xpp2-gpipe-vp2", "interleaved")):
        with pytest.raises(Refused, match=why) as err:
            Layout.parse(name, 8)
        assert "\n" not in str(err.value)
    with pytest.raises(Refused, match="'sp' needs tensor parallelism"):
        Layout.parse("fsdp-sp", 8)
    with pytest.raises(ValueError, match="vocabulary 128256 is not divisible by tp 5"):   # the model's own limit
        h100 = hardware_files.load("h100-sxm-8")
        predict(replace(LLAMA, heads=40, kv_heads=5, ffn=14000), Layout.parse("tp5-vocab", 5), 5, h100,
                device_compute(h100, 0.4), stack=stacks.load("torch-eager"))


def test_the_cli_refuses_a_layout_it_cannot_model_in_one_line(capsys):
    with pytest.raises(SystemExit) as code:
        predict_cli.main(["--model", "llama3-8b", "--hardware", "h100-sxm-8", "--devices", "8",
                          "--layouts", "fsdp-fp8"])
    err = capsys.readouterr().err.strip()
    assert code.value.code == 2 and "fp8 is the software's, not the layout's" in err and len(err.splitlines()) == 1


# ----------------------------------------------------------------------------- published points

def test_every_published_point_parses_and_is_predicted_or_refused(tmp_path, capsys):
    points = published.all_points()
    assert len(points) >= 12 and all(p.source and p.quote for p in points)
    out = tmp_path / "published.json"
    assert predict_cli.main(["--published", "--json", str(out), "--out", str(tmp_path)]) == 0
    result = json.loads(out.read_text())
    assert len(result["points"]) == len(points)
    for point, row in zip(points, result["points"]):
        assert {"name", "source", "metric", "published", "predicted", "error", "generation", "publisher"} <= set(row)
        if row["predicted"] is None:    # fp8, a stack not described, a device without a compute table: why, in a line
            assert row["refused"] == published.refusal(point) and "\n" not in row["refused"]
        else:
            assert row["error"] == pytest.approx(row["predicted"] / row["published"] - 1)
    predicted = [abs(r["error"]) for r in result["points"] if r["error"] is not None]
    assert len(predicted) >= 12 and result["max_abs_error"] == max(predicted)
    assert "median |error|" in capsys.readouterr().out
    assert (tmp_path / "plots" / "predicted-vs-published.png").stat().st_size > 10_000
    heading, _, table, _, refused, _, groups, image = published_blocks(tmp_path)   # bench.report's, same file
    assert (len(table.rows), len(refused.rows)) == (len(predicted), len(points) - len(predicted))
    assert image.path.endswith("predicted-vs-published.png")
    assert len(groups.rows) == len({(by, r[by]) for r in result["points"] for by in ("generation", "publisher")})


def test_spearman_and_the_order_check_by_hand():
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    rows = [{"name": n, "model": "m", "hardware": "h", "devices": 8, "metric": "x", "published": pub, "predicted": pr}
            for n, pub, pr in (("a", 100, 5), ("b", 105, 4), ("c", 150, 9))]
    (group,) = published.rankings(rows)
    assert group["order_holds"]                       # a and b are within 10%: their swap does not count
    rows[2]["predicted"] = 1
    assert not published.rankings(rows)[0]["order_holds"]


def test_every_constant_has_a_value_and_a_source(capsys):
    rows = constants.table()
    assert rows and all(c.value and c.source for c in rows)
    assert predict_cli.main(["--constants"]) == 0
    assert "bench.compute_table" in capsys.readouterr().out


GRID = [[m, n, k, 10.0 * (i + 1)] for i, (m, n, k) in enumerate((m, n, k) for m in (256, 512) for n in (256, 512)
                                                                   for k in (256, 512))]


def _device_files(tmp_path):
    """A compute table and a hardware file of a made-up part, every figure chosen here."""
    table = tmp_path / "t.toml"
    table.write_text('name = "t"\ndevice = "NVIDIA T"\nlaunch_floor_us = 2.5\nlaunch_floor_source = "probe"\n'
                     '[memory]\nGBps = 1500\nsource = "copy"\n[matmul.bf16]\nsource = "grid"\n'
                     f"points = {json.dumps(GRID)}\nshapes = [[300, 256, 256, 50.0], [400, 256, 256, 70.0]]\n"
                     '[attention.flash]\nsource = "fa"\nforward_causal = [[512, 100.0], [1024, 200.0]]\n'
                     "backward = [[512, 80.0]]\n")
    hw = tmp_path / "hw.toml"
    hw.write_text('name = "hw"\ndevice_kind = "cuda"\ndevice_name = "NVIDIA T"\ndevices_per_node = 4\nmemory_GiB = 40\n'
                  f'memory_GBps = 2000\ncompute = "{table}"\ncompute_scale = 0.9\ncompute_scale_source = "bound"\n'
                  'sources = ["sheet"]\n[[link]]\nlevel = "node"\nbusbw_GBps = 100\nlatency_us = 3\nsource = "nv"\n'
                  '[[link]]\nlevel = "network"\nbusbw_GBps = 20\nlatency_us = 7\nsource = "ib"\n')
    return str(table), str(hw)


def test_every_constant_is_its_file_s_figure_with_its_unit_and_source(tmp_path):
    table, hw = _device_files(tmp_path)
    rows = [(c.name, c.value, c.unit, c.source) for c in constants.table([hw])]
    datasheet = ("datasheet; memory-bound work runs at the compute table's copy on this part, else at this times the "
                 "fraction of its datasheet the table's part reached (below); sheet")
    assert rows[:14] == [
        (f"{hw}: devices per node", "4", "", "sheet"), (f"{hw}: memory per device", "40.0", "GiB", "sheet"),
        (f"{hw}: memory bandwidth", "2000", "GB/s", datasheet),            # no bf16 peak is known for the part
        (f"{hw}: node bus bandwidth", "100", "GB/s", "nv"), (f"{hw}: node latency per ring step", "3", "us", "nv"),
        (f"{hw}: network bus bandwidth", "20", "GB/s", "ib"), (f"{hw}: network latency per ring step", "7", "us", "ib"),
        (f"{hw}: compute table", table, "", f"hardware/compute/{table}.toml"),
        (f"{hw}: compute scale", "0.9", "x table", "bound"),
        ("t: kernel launch floor", "2.5", "us", "probe"),
        (f"{hw}: memory bandwidth of memory-bound work", "1500", "GB/s", "copy"),   # measured on this part
        ("t: bf16 matmul rate, 8 shapes 256-512 per dimension", "10.0-80.0 (at the largest: 80.0)", "TFLOP/s", "grid"),
        ("t: bf16 matmul rate at 2 exact shapes (the published points' GEMMs)", "50.0-70.0 (median 70.0)", "TFLOP/s",
         "grid"),
        ("t: flash attention forward (causal), by sequence", "512: 100, 1024: 200", "TFLOP/s", "fa")]
    assert rows[14] == ("t: flash attention backward, by sequence", "512: 80", "TFLOP/s", "fa")
    # the H100's own: a peak the datasheet gives; two descriptions of one table list the table once
    h100 = [c.name for c in constants.table(["h100-sxm-8", "h100-sxm-8"])]
    assert "h100-sxm-8: bf16 dense peak (--assume-mfu, MFU)" in h100
    assert h100.count("h100-sxm: kernel launch floor") == 1
    by_name = {c.name: (c.value, c.unit) for c in constants.table([hw])}
    assert by_name["megatron-te: backward_factor"] == ("1.5", "x forward bytes")
    assert by_name["torch-compile: elementwise_kernels"] == ("7", "/layer")
    assert by_name["torch-eager: fsdp_scatter_copy_bytes"] == ("6.0", "B/element")
    assert by_name["megatron-te: GEMMs split by overlapped tensor-parallel communication"] == \
        ("qkv: tp, fc1: tp, wo.dgrad: tp, w2.dgrad: tp, wo: 4, w2: 4", "chunks")
    assert "torch-eager: GEMMs split by overlapped tensor-parallel communication" not in by_name
    assert [(c.name, c.value, c.unit) for c in constants.model_constants()] == [
        ("flash attention backward FLOPs", "2.5", "x forward"), ("Megatron gradient bucket", "4e+07", "parameters"),
        ("Megatron MFU peak", "989.5", "TFLOP/s"), ("ranking margin", "0.1", "relative")]


def test_each_constant_row_says_its_figure_unit_and_source_in_full(tmp_path):
    table, hw = _device_files(tmp_path)
    two = tmp_path / "two.toml"      # a description of two sources: its rows name the first
    two.write_text(Path(hw).read_text().replace('sources = ["sheet"]', 'sources = ["sheet", "review"]'))
    assert {c.source for c in constants.hardware_constants(str(two))[:2]} == {"sheet"}
    assert constants.gpu_hardware() == ["h100-96gb-500w-8", "h100-sxm-8"]       # the bundled ones with a table
    h100 = {c.name: c for c in constants.hardware_constants("h100-sxm-8")}
    assert h100["h100-sxm-8: bf16 dense peak (--assume-mfu, MFU)"] == constants.Constant(
        "h100-sxm-8: bf16 dense peak (--assume-mfu, MFU)", "989.5", "TFLOP/s", "common.peak_flops (NVIDIA datasheet)")
    assert h100["h100-sxm-8: compute scale"] == constants.Constant("h100-sxm-8: compute scale", "1", "x table",
                                                                   "the part the table was measured on")
    assert [(c.name, c.value, c.unit, c.source) for c in constants.model_constants()] == [
        ("flash attention backward FLOPs", "2.5", "x forward",
         "Dao 2023, FlashAttention-2, section 3 (the backward's 5 matmuls to the forward's 2); the FA papers' "
         "TFLOP/s convention"),
        ("Megatron gradient bucket", "4e+07", "parameters",
         "megatron/core/distributed/distributed_data_parallel.py (core_r0.8.0): max(40M, 1M x dp)"),
        ("Megatron MFU peak", "989.5", "TFLOP/s",
         "H100 SXM dense bf16 (NVIDIA datasheet); the Megatron table's 408.8 / 989 = 41%"),
        ("ranking margin", "0.1", "relative",
         "issue 31: layout order must agree where published figures differ by more than 10%")]
    # a table of 3 sizes of m (one of n and k) and 3 exact shapes; figures printed to 6 digits, as written
    t2 = tmp_path / "t2.toml"
    t2.write_text('name = "t2"\ndevice = "NVIDIA T"\nlaunch_floor_us = 2.0000045\n[memory]\nGBps = 100001.50000001\n'
                  '[matmul.bf16]\npoints = [[128, 256, 64, 1.0], [256, 256, 64, 2.0], [512, 256, 64, 3.0]]\n'
                  'shapes = [[1, 1, 1, 9.0], [2, 1, 1, 5.0], [3, 1, 1, 6.0]]\n')
    hw2 = tmp_path / "hw2.toml"
    hw2.write_text(Path(hw).read_text().replace(table, str(t2)))
    assert [(c.name, c.value) for c in constants.compute_constants(str(hw2))] == [
        ("t2: kernel launch floor", "2"), (f"{hw2}: memory bandwidth of memory-bound work", "100002"),
        ("t2: bf16 matmul rate, 3 shapes 128-512 per dimension", "1.0-3.0 (at the largest: 3.0)"),
        ("t2: bf16 matmul rate at 3 exact shapes (the published points' GEMMs)", "5.0-9.0 (median 6.0)")]
    # each stack: its ten figures, its elementwise formula and, where it overlaps, its split, with its sources
    rows = constants.stack_constants()
    te = [(c.name, c.value, c.unit) for c in rows if c.name.startswith("megatron-te: ")]
    assert te == [("megatron-te: attention_kernel", "cudnn", ""), ("megatron-te: fused_projections", "True", ""),
                  ("megatron-te: elementwise_kernels", "5", "/layer"),
                  ("megatron-te: backward_factor", "1.5", "x forward bytes"),
                  ("megatron-te: logit_bytes", "20.0", "B/logit"), ("megatron-te: selective", "attention", ""),
                  ("megatron-te: optimizer_bytes", "42.0", "B/element"),
                  ("megatron-te: fsdp_gather_copy_bytes", "0.0", "B/element"),
                  ("megatron-te: fsdp_scatter_copy_bytes", "0.0", "B/element"),
                  ("megatron-te: grad_reduce_bytes", "4.0", "B/element"),
                  ("megatron-te: logit_live_bytes", "10.0", "B/logit"),
                  ("megatron-te: elementwise bytes per token and layer (forward)",
                   "20h + 4f (GELU) or 6f (SwiGLU); h-wide part / tp under sp", "B"),
                  ("megatron-te: GEMMs split by overlapped tensor-parallel communication",
                   "qkv: tp, fc1: tp, wo.dgrad: tp, w2.dgrad: tp, wo: 4, w2: 4", "chunks")]
    # torch-eager and both llm-foundry stacks overlap nothing; torch-compile splits its GEMMs, and with Float8 says
    # its casts' bytes (9 rows); the three torch stacks say their context parallelism (11 rows each); Megatron-
    # Bridge's FP8 its casts and its split; OLMo-core's two stacks split nothing, run no context parallelism, and
    # the Float8 one says its casts
    assert len(rows) == 13 + 12 + 13 + (13 + 9) + 12 + 12 + (13 + 9) + 3 * 11 + 12 + (12 + 9)
    named = [(c.name, c.value, c.unit) for c in rows]
    assert ("torch-compile-float8: float8 transpose_bytes", "2.0", "B/element") in named
    assert ("torch-eager: context parallel merge_step", "38.0", "B/element/step") in named
    assert ("megatron-bridge-fp8-cs: float8 weights_in_fp8", "True", "") in named
    assert ("megatron-bridge-fp8-cs: grad_reduce_bytes", "2.0", "B/element") in named
    for c in rows:
        stack = stacks.load(c.name.split(": ")[0])
        source = stack.tp_overlap_source if "overlapped" in c.name else \
            stack.float8.source if ": float8 " in c.name else \
            stack.context_parallel.source if ": context parallel " in c.name else stack.source
        assert c.source == source, c.name


def test_a_published_file_s_points_take_the_source_s_defaults_and_their_own_figures(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('[source]\npublisher = "P"\nwhere = "page 3"\nhardware = "h100-sxm-8"\nstack = "megatron-te"\n'
                    'flops = "megatron"\n[[point]]\nname = "a"\nmodel = "llama3-8b"\ndevices = "8"\nlayout = "fsdp8"\n'
                    'global_batch = "16"\nmetric = "mfu"\npublished = "0.5"\nquote = "| a |"\n[[point]]\nname = "b"\n'
                    'model = "llama3-8b"\ndevices = 16\nlayout = "fsdp16"\nglobal_batch = 32\n'
                    'metric = "tokens_per_s_per_gpu"\npublished = 6000\nquote = "| b |"\n'
                    'hardware = "h100-96gb-500w-8"\nstack = "torch-eager"\nflops = ""\nseq_len = 4096\n'
                    'assumed = "mbs"\n')
    a, b = published.load(path)
    assert a == published.Point("a", "llama3-8b", 8, "fsdp8", 16, "mfu", 0.5, "| a |", "h100-sxm-8", "megatron-te",
                                "megatron", "P: page 3")
    assert (b.hardware, b.stack, b.flops, b.seq_len, b.assumed, b.devices, b.published) == \
        ("h100-96gb-500w-8", "torch-eager", "", 4096, "mbs", 16, 6000.0)
    path.write_text(path.read_text().replace('metric = "mfu"', 'metric = "tflops"'))
    with pytest.raises(ValueError, match=r"p.toml: a: metric 'tflops' is not one of tokens_per_s_per_gpu, "
                                         r"tflops_per_gpu, mfu"):
        published.load(path)


def test_a_step_time_is_the_publisher_s_figure_counted_as_it_counts():
    point = published.Point("x", "megatron-gpt-177b", 96, "tp8xpp6-mbs1", 1152, "tflops_per_gpu", 1.0, "", "h100-sxm-8",
                            "megatron-te", "megatron", "")
    step = 10.0
    assert published.metric_of(point, GPT, step) == pytest.approx(published.megatron_flops(GPT, 1152) / 10 / 96 / 1e12)
    assert published.metric_of(replace(point, metric="mfu"), GPT, step) == \
        pytest.approx(published.megatron_flops(GPT, 1152) / 10 / 96 / 989.5e12)
    assert published.metric_of(replace(point, metric="tokens_per_s_per_gpu"), GPT, step) == 1152 * 4096 / 10 / 96
    with pytest.raises(ValueError, match="x: tflops_per_gpu needs the publisher's FLOP formula"):
        published.metric_of(replace(point, flops=""), GPT, step)
    # Megatron's count of a Llama: GQA's K and V (8 of 32 heads) and SwiGLU's third matrix, by hand
    s, h, L, f, V = LLAMA.seq_len, LLAMA.hidden, LLAMA.layers, LLAMA.ffn, LLAMA.vocab
    by_hand = 12 * s * L * h * h * ((1 + 8 / 32 + s / h) + f / h * 1.5 + V / (2 * L * h))
    assert published.megatron_flops(LLAMA, 1) == pytest.approx(by_hand, rel=1e-12)


def test_the_gemm_shapes_a_probe_measures_are_those_the_points_time():
    point = next(p for p in published.all_points() if p.layout == "fsdp8-mbs2-sel")    # torchtitan's 8B, eager
    shapes = published.gemm_shapes([point])
    tokens = 2 * 8192                     # a micro-batch of 2 sequences
    assert (tokens, 4096, 4096) in shapes and (tokens, 1024, 4096) in shapes and (tokens, 14336, 4096) in shapes
    assert (4096, 4096, tokens) in shapes and (tokens, 128256, 4096) in shapes     # a weight gradient, the output
    assert shapes == sorted(set(shapes)) and all(min(s) > 0 for s in shapes)
    assert shapes == sorted(set(published.gemm_shapes([point, point])))


def test_each_stack_s_memory_bound_bytes_are_its_code_s_counted_by_hand():
    """Bytes per token of one layer's forward elementwise work, (h-wide, the rest), as each stack's comments count
    them, for Llama 3 8B (h 4096, q 4096, kv 1024, f 14336: RMSNorm, RoPE, GQA, SwiGLU) and GPT 177B (h 12288, MHA,
    learned positions, LayerNorm, GELU 4h)."""
    h, q, kv, f = 4096, 4096, 1024, 14336
    megatron, eager, compiled = (stacks.load(n).elementwise for n in ("megatron-te", "torch-eager", "torch-compile"))
    assert megatron(LLAMA) == (2 * 4 * h + 2 * 6 * h, 6 * f)
    assert eager(LLAMA) == (2 * 36 * h + 2 * 6 * h, 20 * (q + kv) + 2 * (2 * kv + 2 * q) + 4 * q + 10 * f)
    assert compiled(LLAMA) == (2 * 8 * h, 4 * (q + kv) + 2 * (2 * kv + 2 * q) + 4 * q + 6 * f)
    g = 12288                                            # GPT: no RoPE, no repeat_kv, LayerNorm fused, GELU
    assert megatron(GPT) == (20 * g, 4 * 4 * g)
    assert eager(GPT) == (2 * 4 * g + 2 * 6 * g, 4 * g + 4 * 4 * g)
    assert compiled(GPT) == (2 * 8 * g, 4 * g + 4 * 4 * g)
    # OLMo 2's blocks under OLMo-core's compiled stack: each branch's norm and the residual add one kernel (6h, no
    # normalised copy), QK-norm's sum of squares a read of Q and K (2(q + kv)), no repeat (MHA)
    olmo, olmo2 = stacks.load("olmo-core"), decoder.load("olmo2-7b")
    assert olmo.elementwise(olmo2) == (2 * 6 * h, 4 * (q + q) + 2 * (q + q) + 4 * q + 6 * 11008)
    assert olmo.elementwise(LLAMA) == compiled(LLAMA)      # a pre-norm Llama block as torchtitan's compiled one
    assert eager(olmo2)[1] - eager(replace(olmo2, qk_norm=False))[1] == 36 * (q + q)   # eager: RMSNorm's 36 B
    for name in ("megatron-te", "torch-eager", "torch-compile", "llm-foundry"):   # none builds OLMo 2's blocks,
        for model in (olmo2, replace(LLAMA, qk_norm=True), replace(LLAMA, norm_position="output")):  # or either part
            with pytest.raises(ValueError) as refused:
                stacks.load(name).check_model(model)
            assert str(refused.value) == (f"{model.name}: {name} does not build OLMo 2's blocks (QK-norm, the norm "
                                          "on each branch's output); the olmo-core stacks do")
    olmo.check_model(olmo2)
    stacks.load("torch-compile").check_model(LLAMA)
    point = next(p for p in published.all_points() if p.model == "olmo2-7b")   # and the prediction refuses it
    assert published.predict_point(replace(point, stack="torch-compile"))["refused"].startswith(
        "olmo2-7b: torch-compile does not build OLMo 2's blocks")
    with pytest.raises(ValueError, match="stack 'deepspeed': the model knows megatron-te, torch-eager, torch-compile"):
        stacks.load("deepspeed")
    with pytest.raises(ValueError, match=r"torch-eager cannot overlap tensor-parallel communication \(tpo\): torch's "
                                         r"async TP needs torch.compile"):
        stacks.load("torch-eager").check(Layout.parse("tp2xfsdp4-sp-tpo", 8))
    stacks.load("torch-compile").check(Layout.parse("tp2xfsdp4-sp-tpo", 8))
    with pytest.raises(ValueError, match="fsdp8: megatron-te does not run it: Megatron-LM core_r0.8.0 shards no"):
        stacks.load("megatron-te").check(Layout.parse("fsdp8", 8))
    # what a plan counts each refused candidate under: the reason, without the layout's name
    assert stacks.load("megatron-te").refusal(Layout.parse("fsdp8", 8)).startswith(
        "megatron-te does not run it: Megatron-LM core_r0.8.0 shards no")
    assert stacks.load("torch-compile").refusal(Layout.parse("tp2xfsdp4-sp-tpo", 8)) is None


def test_llm_foundry_s_memory_bound_bytes_and_kernels_are_its_code_s_counted_by_hand():
    """MPT-7B (h 4096, MHA, GELU f 16384) as llm-foundry runs it (stacks._mpt's comments): forward, 2 LayerNorms
    (4h) and 2 residual adds (6h); GELU 4f; attn_impl flash unpads Q, K, V (a gather, 2 + 2 each) and pads the output
    (zeros 2, index_put 2 + 2). The backward counted op by op, over the forward's bytes: LayerNorm's dx (6h) and
    dgamma/dbeta (4h) x 2, the forked residual's two gradients summed (6h) x 2, GELU's (6f), the pad's gather (4q),
    the unpad's zeros + scatter (6 per Q, K, V element), Wqkv's split joined (4), the 4 bias gradients (2 per
    output element); triton the same less the padding."""
    mpt = decoder.load("mpt-7b")
    h, q, kv, f = 4096, 4096, 4096, 16384
    assert (mpt.hidden, mpt.q_width, mpt.kv_width, mpt.ffn) == (h, q, kv, f)
    flash, triton = stacks.load("llm-foundry"), stacks.load("llm-foundry-triton")
    assert flash.elementwise(mpt) == (2 * 4 * h + 2 * 6 * h, 4 * f + 4 * (q + 2 * kv) + (2 + 4) * q)
    assert triton.elementwise(mpt) == (2 * 4 * h + 2 * 6 * h, 4 * f)
    # a GQA, gated model (Llama 3 8B: q 4096, kv 1024, f 14336): no repeat_kv under flash-attn 2; MPTGLU's act x up
    assert flash.elementwise(LLAMA) == (20 * 4096, 10 * 14336 + 4 * (4096 + 2 * 1024) + 6 * 4096)
    bias_grads = 2 * (q + 2 * kv) + 2 * h + 2 * f + 2 * h
    backward = 2 * (6 * h + 4 * h) + 2 * 6 * h + 6 * f + bias_grads + 4 * (q + 2 * kv)
    assert flash.backward_factor == (backward + 4 * q + 6 * (q + 2 * kv)) / sum(flash.elementwise(mpt)) == 2.0
    assert triton.backward_factor == pytest.approx(backward / sum(triton.elementwise(mpt)), rel=1e-15)
    # forward kernels: LayerNorm, 3 x unpad_input (sum, nonzero, max, cumsum, pad, gather), pad_input's zeros and
    # index_put, the residual add, LayerNorm, GELU, the residual add; triton: no unpadding, no padding
    assert flash.elementwise_kernels == 1 + 3 * 6 + 2 + 4 and triton.elementwise_kernels == 1 + 4
    assert (flash.attention_kernel, triton.attention_kernel, flash.fused_projections) == ("fa2", "mpt_triton", True)


def test_llm_foundry_s_bytes_are_its_source_s_sums():
    """Composer's DecoupledAdamW one parameter at a time, weight decay 0 (exp_avg mul_ 8, add_ 12; exp_avg_sq mul_
    8, addcmul_ 12; sqrt 8, / 8, + eps 8; addcdiv_ 16) and FSDP's clip_grad_norm_ (4 + 8); flash-attn's fused
    cross entropy on bf16 logits (forward reads 2, backward reads 2 and writes 2); FSDP1's all-gather lands in the
    FlatParameter (no copy-out) and its gradient is joined (cat 2 + 2), cast to float32 (2 + 4) and pre-divided
    (4 + 4) before the reduce-scatter. The triton stack differs in its attention and elementwise work only."""
    flash, triton = stacks.load("llm-foundry"), stacks.load("llm-foundry-triton")
    assert flash.optimizer_bytes == (8 + 12) + (8 + 12) + 8 + 8 + 8 + 16 + (4 + 8) == 92
    assert flash.logit_bytes == 2 + 2 + 2
    assert (flash.fsdp_gather_copy_bytes, flash.fsdp_scatter_copy_bytes) == (0, (2 + 2) + (2 + 4) + (4 + 4))
    differ = {"name", "description", "attention_kernel", "elementwise", "elementwise_kernels", "backward_factor",
              "elementwise_formula", "source"}
    assert all(getattr(triton, f.name) == getattr(flash, f.name) for f in fields(flash) if f.name not in differ)
    assert "5e85bd62d4ec" in flash.source and "v0.3.0" in triton.source and "b2a43a1477a4" in triton.source


@pytest.mark.parametrize("layout, why", [
    ("tp2xfsdp4-sp", "llm-foundry 5e85bd62d4ec splits no model"),
    ("tp2xfsdp4-sp-tpo", "llm-foundry 5e85bd62d4ec splits no model"),     # its own words before tpo's
    ("fsdp4xpp2-1f1b", "llm-foundry 5e85bd62d4ec splits no model"),
    ("cp2xfsdp4", "llm-foundry 5e85bd62d4ec splits no model"),
    ("dp8-zero1", "Composer v0.17.2's FSDP has no ZeRO-1"),
    ("dp8", "llm-foundry replicates through FSDP's NO_SHARD"),
    ("fsdp8-sel", "llm-foundry checkpoints whole MPT blocks"),
    ("fsdp8", None), ("fsdp8-rc", None), ("dp2xfsdp4-mbs2", None),
])
def test_llm_foundry_refuses_what_its_code_does_not_run_and_runs_the_rest(layout, why):
    parsed = Layout.parse(layout, 8)
    for name in ("llm-foundry", "llm-foundry-triton"):
        if why is None:
            stacks.load(name).check(parsed)
            continue
        with pytest.raises(ValueError, match=f"^{re.escape(f'{parsed.name}: {name} does not run it: {why}')}"):
            stacks.load(name).check(parsed)


def test_each_stack_s_overlap_splits_the_gemms_its_layer_runs_as_its_source_says():
    """A GEMM named in tp_overlap_split that the stack's layer does not run would be chunked nowhere, silently.
    Transformer Engine's defaults (initialize_ub): ring exchange, one chunk per rank, for the fused QKV and FC1
    forward and the output and FC2 projections' input gradients; 4 splits for those two projections' forward.
    torch's async TP decomposes every all-gather + matmul and matmul + reduce-scatter: each GEMM and its dgrad."""
    for stack in stacks.STACKS.values():
        names = {g.name for g in LLAMA.layer_gemms(8192, 2, stack.fused_projections)}
        for gemm, chunks in stack.tp_overlap_split:
            assert gemm.removesuffix(".dgrad") in names and (chunks == "tp" or int(chunks) > 1), (stack.name, gemm)
    assert dict(stacks.load("megatron-te").tp_overlap_split) == {
        "qkv": "tp", "fc1": "tp", "wo.dgrad": "tp", "w2.dgrad": "tp", "wo": "4", "w2": "4"}
    unfused = [g.name for g in LLAMA.layer_gemms(8192, 2)]
    assert dict(stacks.load("torch-compile").tp_overlap_split) == {
        **{g: "tp" for g in unfused}, **{f"{g}.dgrad": "tp" for g in unfused}}
    assert stacks.load("torch-eager").tp_overlap_split == ()


@pytest.mark.parametrize("stack, layout, why", [
    ("torch-eager", "dp8-zero1", "torchtitan 9dec370 has no ZeRO-1: it shards with FSDP2 (fsdp)"),
    ("torch-compile", "dp2xtp4-sp", "torchtitan 9dec370 replicates with DDP only alone"),
    ("torch-compile", "dp2xpp4-1f1b", "torchtitan 9dec370 replicates with DDP only alone"),
    ("torch-eager", "tp2xfsdp4", "torchtitan's tensor-parallel plan always splits the norms over the sequence"),
    ("megatron-te", "dp2xfsdp4", "Megatron-LM core_r0.8.0 shards no parameters"),
    ("torch-eager", "dp8", None), ("torch-compile", "dp2xfsdp4", None), ("torch-eager", "tp2xfsdp4-sp", None),
    ("torch-compile", "fsdp2xpp4-1f1b", None), ("megatron-te", "dp8-zero1", None),
    ("megatron-te", "cp2xtp2xdp2-sp", None), ("torch-compile", "cp2xfsdp4", None), ("torch-eager", "cp8", None),
    ("megatron-bridge-fp8-cs", "fsdp8", "Megatron-FSDP (Megatron-Bridge's use_megatron_fsdp"),
    ("megatron-bridge-fp8-cs", "dp2xtp4-sp-zero1-tpo", None),
    ("olmo-core", "tp2xfsdp4-sp", "OLMo-core e27ba7455 splits no model"),
    ("olmo-core-float8", "cp2xfsdp4", "OLMo-core e27ba7455 splits no model"),
    ("olmo-core", "dp8-zero1", "OLMo-core e27ba7455 has no ZeRO-1"),
    ("olmo-core", "fsdp8-zero2", "OLMo-core e27ba7455 reshards every block but the last after its forward"),
    ("olmo-core", "dp8", "OLMo-core's DDP (torch's replicate, bucket_cap_mb 100) is not described"),
    ("olmo-core", "fsdp8-mbs2", None), ("olmo-core-float8", "dp2xfsdp4", None),
])
def test_a_stack_refuses_what_its_code_does_not_run_and_runs_the_rest(stack, layout, why):
    parsed = Layout.parse(layout, 8)
    if why is None:
        stacks.load(stack).check(parsed)
        return
    with pytest.raises(ValueError, match=f"^{re.escape(f'{parsed.name}: {stack} does not run it: {why}')}"):
        stacks.load(stack).check(parsed)


def test_each_stack_s_bytes_are_its_source_s_sums():
    """The per-element figures each source adds up (Stack.source): Megatron's fused Adam 30 B + multi-tensor clipping
    12 B; torchtitan's foreach AdamW 80 B + clipping 12 B, its float32 cross entropy 6 + 8 forward and 22 backward
    per logit, FSDP2's copy-out 2 + 2 per gathered element and copy-in to float32 2 + 4; torch.compile changes
    the elementwise work only."""
    megatron, eager, compiled = (stacks.load(n) for n in ("megatron-te", "torch-eager", "torch-compile"))
    assert (megatron.optimizer_bytes, eager.optimizer_bytes) == (30 + 12, 80 + 12)
    assert eager.logit_bytes == 6 + 8 + 22
    assert (eager.fsdp_gather_copy_bytes, eager.fsdp_scatter_copy_bytes) == (2 + 2, 2 + 4)
    assert (megatron.fsdp_gather_copy_bytes, megatron.fsdp_scatter_copy_bytes) == (0, 0)   # it runs no FSDP
    same = ("attention_kernel", "fused_projections", "backward_factor", "logit_bytes", "selective",
            "optimizer_bytes", "fsdp_gather_copy_bytes", "fsdp_scatter_copy_bytes", "fsdp_reshard_under_pp",
            "refuses")
    assert all(getattr(compiled, f) == getattr(eager, f) for f in same)
    assert (eager.fsdp_reshard_under_pp, megatron.fsdp_reshard_under_pp) == (False, True)
    # torch's context parallelism, per element: the merge (block to float32 2 + 4, out - block 4 + 4 + 4, times the
    # weight 4 + 4, out - product 4 + 4 + 4), once (first block to float32, result to bf16); the backward's float32
    # accumulators zeroed 4 and cast back 4 + 2, a query gradient added 4 + 2 + 4, K's and V's added whole 4 + 2 + 4
    # or in half through a cat (5 + 8), then cat'ed to be sent (4 + 4)
    cp = eager.context_parallel
    assert (cp.merge_step, cp.merge_once, cp.send_copy) == (6 + 12 + 8 + 12, 6 + 6, 2 + 2)
    assert (cp.grad_once, cp.grad_q_step, cp.grad_kv_first, cp.grad_kv_step) == (4 + 6, 10, 10 + 8, 5 + 8 + 8)
    assert (cp.grad_bytes, cp.kv_repeated, eager.fsdp_over_cp) == (4, True, True)
    assert compiled.context_parallel is cp and megatron.context_parallel is None and not megatron.fsdp_over_cp
    # Megatron-Bridge's FP8 recipes: TE's fused cross entropy (the bf16 logits read twice, their gradient written in
    # place, then scaled by the per-token loss gradient: 2 + 2 + 2 + 2 + 2), gradients reduced in bf16; TE's
    # current scaling: a cast 2 + 1, an amax 2, a copy after a gather 1 + 1, a master shard's amax, read and cast
    # 4 + 4 + 1; Megatron-Core's layer with RoPE fused: 4 B an element of Q and K
    bridge = stacks.load("megatron-bridge-fp8-cs")
    te8 = bridge.float8
    assert (bridge.logit_bytes, bridge.grad_reduce_bytes, megatron.grad_reduce_bytes) == (10, 2, 4)
    assert (te8.cast_bytes, te8.amax_bytes, te8.transpose_bytes, te8.scale_bytes) == (2 + 1, 2, 1 + 1, 4 + 4 + 1)
    assert te8.transpose_in_cast and te8.amax_unfused and te8.weights_in_fp8
    assert bridge.elementwise(LLAMA) == (megatron.elementwise(LLAMA)[0],
                                         megatron.elementwise(LLAMA)[1] + 4 * (4096 + 1024))
    assert bridge.elementwise(replace(LLAMA, position="learned")) == megatron.elementwise(LLAMA)
    assert dict(bridge.tp_overlap_split) == {g: "tp" for g in ("qkv", "fc1", "wo.dgrad", "w2.dgrad", "wo", "w2")}


def test_fsdp2_copies_the_root_s_parameters_once_a_step_as_it_copies_a_block_s():
    """torch 2.6.0's _fsdp_collectives.py (torchtitan's torch 1963fc8): the root unit, fully_shard(model) over the
    embedding, final norm and output layer, is gathered through split_with_sizes_copy (2 + 2 per element) and its
    gradients chunk_cat into the float32 reduce-scatter input (2 + 4), as each block's are; once a step: the root
    is not resharded after its forward (_fsdp_state._lazy_init), and torchtitan runs one micro-batch without a
    pipeline. torchtitan's 8B on its 8 H100 (HBM2e at 2,400 GB/s on the datasheet, copying at the 2,993 / 3,350 of
    its datasheet that the bundled table's H100 reached), in bytes."""
    hw = hardware_files.load("h100-96gb-500w-8")
    p = predict(LLAMA, Layout.parse("fsdp8-mbs2-sel", 8), 16, hw, compute_for(hw), stack=stacks.load("torch-eager"))
    block = 4096 * (4096 + 1024 + 1024 + 4096 + 3 * 14336) + 2 * 4096     # 218,112,000
    root = 128256 * 4096 + 4096 + 128256 * 4096                           # 1,050,677,248
    assert (LLAMA.layer_params(), LLAMA.param_count() - 32 * block) == (block, root)
    blocks = 32 * block * (2 * (2 + 2) + (2 + 4))   # gathered for the forward and again for the backward: 97.71 GB
    assert blocks + root * ((2 + 2) + (2 + 4)) == 97_714_176_000 + 10_506_772_480
    copied_Bps = 2400e9 * 2993 / 3350
    assert p.parts["fsdp_copies"] == pytest.approx((97_714_176_000 + 10_506_772_480) / copied_Bps, rel=1e-12)


def test_overlapped_tensor_parallel_hides_its_communication_but_chunks_its_gemms():
    spec, hw = decoder.load("megatron-gpt-177b"), hardware_files.load("h100-sxm-8")
    c, meg = compute_for(hw), stacks.load("megatron-te")
    exposed = predict(spec, Layout.parse("tp8xpp6-sp-zero1-mbs1-1f1b-vocab", 48), 48, hw, c, stack=meg)
    overlapped = predict(spec, Layout.parse("tp8xpp6-sp-zero1-tpo-mbs1-1f1b-vocab", 48), 48, hw, c, stack=meg)
    # Transformer Engine's ring exchange runs QKV and FC1 in 8 chunks of 512 tokens: slower GEMMs, hidden comm.
    assert overlapped.parts["gemm"] > exposed.parts["gemm"]
    assert overlapped.comm_exposed_s < exposed.comm_exposed_s
    with pytest.raises(ValueError, match="async TP needs torch.compile"):    # eager torch has no async TP
        predict(LLAMA, Layout.parse("tp2xfsdp-sp-tpo", 8), 8, hw, c, stack=stacks.load("torch-eager"))


def test_torchtitan_keeps_a_pipeline_stage_s_layers_gathered_from_forward_to_backward():
    """apply_fsdp's reshard_after_forward = not pp_enabled, and torch's pipelining (backward_maybe_with_nosync)
    reshard_after_backward and gradient sync off until the last micro-batch: under a pipeline each layer is
    gathered once a step, its gradients reduce-scattered once, and the stage holds all its layers' bf16 weights and
    their float32 gradients, accumulated unsharded, through the step."""
    hw = hardware_files.load("h100-sxm-8")
    c, titan = compute_for(hw), stacks.load("torch-compile")
    piped = Layout.parse("fsdp2xpp4-mbs1-1f1b", 8)     # 8 micro-batches, 8 layers a stage
    kept = predict(LLAMA, piped, 16, hw, c, stack=titan)
    resharded = predict(LLAMA, piped, 16, hw, c, stack=replace(titan, fsdp_reshard_under_pp=True))

    def gathers(p):
        return next(x for x in p.collectives if x.kind == "all_gather" and x.dim == "fsdp").calls
    assert (gathers(kept), gathers(resharded)) == (8, 2 * 8 * 8)
    assert kept.model_per_rank[0] - resharded.model_per_rank[0] == pytest.approx((8 - 2) * LLAMA.layer_params() * 2
                                                                                 + 8 * LLAMA.layer_params() * 4)
    assert kept.parts["data_parallel_comm"] < resharded.parts["data_parallel_comm"]
    flat = Layout.parse("fsdp8-mbs1", 8)                # no pipeline: resharded after forward either way
    assert predict(LLAMA, flat, 16, hw, c, stack=titan).step_s == \
        predict(LLAMA, flat, 16, hw, c, stack=replace(titan, fsdp_reshard_under_pp=True)).step_s


def test_zero2_keeps_every_layer_gathered_from_its_forward_to_its_backward_whatever_the_stack():
    """fsdp<N>-zero2 (torch FSDP's SHARD_GRAD_OP, llm-foundry's small models): each layer gathered once a
    micro-batch, not again for its backward; the rank holds all its layers' bf16 weights between the two. torchtitan
    has no such option without a pipeline: refused."""
    hw = hardware_files.load("h100-sxm-8")
    c, foundry, mpt = compute_for(hw), stacks.load("llm-foundry"), decoder.load("mpt-1b")
    zero3, zero2 = (predict(mpt, Layout.parse(name, 8), 32, hw, c, stack=foundry)
                    for name in ("fsdp8-mbs2", "fsdp8-mbs2-zero2"))   # 2 micro-batches of 2

    def gathers(p):
        return next(x for x in p.collectives if x.kind == "all_gather" and x.dim == "fsdp").calls
    assert (gathers(zero2), gathers(zero3)) == (2 * mpt.layers, 2 * 2 * mpt.layers)
    assert zero2.model_per_rank[0] - zero3.model_per_rank[0] == pytest.approx((mpt.layers - 2) * mpt.layer_params() * 2)
    assert zero2.parts["data_parallel_comm"] < zero3.parts["data_parallel_comm"]
    assert zero2.optimizer_s == zero3.optimizer_s          # the same shard updated
    with pytest.raises(ValueError, match="no ZeRO-2 without pp"):
        predict(LLAMA, Layout.parse("fsdp8-mbs2-zero2", 8), 16, hw, c, stack=stacks.load("torch-eager"))


def test_every_point_is_predicted_again_on_every_table_measured_of_its_part(tmp_path):
    """The bundled H100 table was written from one of the six records measured of that H100: predicted from that
    record the point's error is the bundled one; each point's worst error is its largest over them all, and the
    goals' figures are of the worst. A checkout without records predicts from the bundled table alone."""
    point = next(p for p in published.all_points() if p.name == "megatron GPT-3 177B strong scaling, 96 H100")
    result = published.check([point])
    [row] = result["points"]
    assert len(row["error_by_table"]) == 6 == len(result["tables"]["h100-sxm-8"])
    assert row["error_by_table"]["h100x1/compute/h100-compute-hot-interleaved.json"] == pytest.approx(row["error"])
    assert row["worst_error"] == max([row["error"], *row["error_by_table"].values()], key=abs) > row["error"]
    assert result["worst_max_abs_error"] == abs(row["worst_error"]) > result["max_abs_error"]
    bare = published.check([point], reference=tmp_path)
    assert bare["points"][0]["error_by_table"] == {} and bare["worst_max_abs_error"] == bare["max_abs_error"]


def _measurement(graph_us: float | None, sustained: bool) -> dict:
    """A bench.compute_table measurement as its JSON holds one (figures made up, shapes as a GPU run writes them)."""
    run = {"precision": "bf16", "shape": [8192, 8192, 8192], "seconds": 60.0, "first_tflops": 700.0,
           "steady_tflops": 630.0, "steady_over_first": 0.9, "series": [[0.5, 700.0], [60.0, 630.0]]}
    return {"device": "NVIDIA H100 80GB HBM3", "software": "torch 2.13.0, CUDA 13.0", "date": "2026-11-28",
            "launch_us": {"eager": 5.25, "graph": graph_us},
            "copy_GBps": {str(64 << 20): 2500.0, str(1 << 30): 3012.0, str(256 << 20): 2900.0},
            "matmul": {"bf16": {"grid": GRID,
                                "shapes": [[8192, 1024, 4096, 600.5]]},
                       "fp8": {"grid": [[256, 256, 256, 12.0]], "shapes": []}},
            "attention": {"torch_flash": {"forward_causal": [[512, 100.5], [1024, 200.0]],
                                          "backward": [[512, 80.0], [1024, 150.0]]}},
            **({"sustained": run} if sustained else {})}


def test_a_measurement_becomes_the_compute_table_the_model_reads(tmp_path):
    from common.predict.compute_table import toml_text
    from common.predict.hardware import tomllib

    text = toml_text(_measurement(2.125, True), "h100-here", "h100.json")
    raw = tomllib.loads(text)
    where = ("parbench's probe (python -m bench.compute_table), NVIDIA H100 80GB HBM3, torch 2.13.0, CUDA 13.0, "
             "2026-11-28: h100.json")
    # The launch floor is a CUDA graph's where one was timed; the largest copy (1 GiB, not the last listed) is the
    # memory bandwidth; a precision without exact shapes has none; each section names the record it came from.
    assert (raw["name"], raw["device"], raw["launch_floor_us"], raw["eager_launch_us"]) == \
        ("h100-here", "NVIDIA H100 80GB HBM3", 2.12, 5.25)
    assert raw["launch_floor_source"] == f"{where}: back-to-back one-element adds from a CUDA graph"
    assert raw["memory"] == {"GBps": 3012, "source": f"{where}: a 1024 MiB device-to-device copy, bytes read "
                                                       "and written"}
    assert raw["matmul"]["bf16"] == {
        "source": f"{where}: C[m, n] = A[m, k] B[k, n], row-major operands, median of 5 batches",
        "points": GRID, "shapes": [[8192, 1024, 4096, 600.5]]}
    assert raw["matmul"]["fp8"]["points"] == [[256, 256, 256, 12.0]] and "shapes" not in raw["matmul"]["fp8"]
    assert raw["attention"]["torch_flash"] == {"source": f"{where}: SDPA causal, 16384 tokens, 16 heads of 128",
                                               "forward_causal": [[512, 100.5], [1024, 200.0]],
                                               "backward": [[512, 80.0], [1024, 150.0]]}
    assert "# Measured straight after 60 s of one bf16 8192x8192x8192 GEMM back to back, at the clocks a long " \
           "run holds: that GEMM\n# ran at 700 TFLOP/s in its first half second, 630 in its last third (x0.900)." \
        in text
    assert text.startswith("# How fast NVIDIA H100 80GB HBM3 computes, measured by parbench (python -m "
                           "bench.compute_table);\n# bench.predict's first-principles compute "
                           "(common/predict/gpu_compute.py) reads it.\n")
    # Read back by the model, on hardware of that device (another part would keep its datasheet bandwidth).
    (tmp_path / "t.toml").write_text(text)
    compute = compute_for(hardware_files.load(_hardware(tmp_path / "hw.toml", tmp_path / "t.toml",
                                                        "NVIDIA H100 80GB HBM3")))
    assert compute.launch_floor_s == pytest.approx(2.12e-6) and compute.memory_Bps == 3012e9
    assert compute.matmul["bf16"].rate(8192, 1024, 4096) == 600.5 and compute.matmul["bf16"].rate(512, 256, 512) == 60
    assert compute.attention["torch_flash"].rate(1024, backward=True) == 150.0
    # No graph timed: Python's launch; no sustained run first: said; no copy measured: no memory section. A
    # dimension of a million rows stays an integer (as %g it would be 1.04858e+06), a whole rate is written whole;
    # an empty list is one.
    bare = {**_measurement(None, False), "copy_GBps": {}}
    bare["matmul"] = {"bf16": {"grid": [[1 << 20, 256, 256, 100.0]], "shapes": []}, "fp8": {"grid": [], "shapes": []}}
    raw, text = tomllib.loads(toml_text(bare, "x", "x.json")), toml_text(bare, "x", "x.json")
    assert "points = [\n  [1048576, 256, 256, 100],\n]" in text and raw["matmul"]["fp8"]["points"] == []
    assert raw["launch_floor_us"] == 5.25 and raw["launch_floor_source"].endswith("adds from Python")
    assert "memory" not in raw and "# Measured without a sustained load first (no --sustain-s): a long run's " \
                                   "clocks may be lower." in text


def test_a_measurement_s_summary_shows_what_the_table_rests_on():
    from rich.console import Console

    from bench.compute_table import summary

    console = Console(record=True, width=300)
    measured = _measurement(2.125, True)
    # The best rate at a shape neither first nor last in the grid's order; four exact shapes (the upper median).
    measured["matmul"]["bf16"] = {"grid": [[256, 512, 1024, 90.0], [512, 512, 512, 80.0]],
                                  "shapes": [[1, 2, 3, 400.0], [1, 2, 3, 100.0], [1, 2, 3, 300.0], [1, 2, 3, 200.0]]}
    console.print(summary({**measured, "failed": {"matmul.fp8": "RuntimeError: no fp8 units"}}))
    lines = [" ".join(line.replace("│", " ").replace("┃", " ").split()) for line in console.export_text().splitlines()]
    assert "what measured" in lines
    for row in ("shortest kernel from Python (us) 5.25", "shortest kernel from a CUDA graph (us) 2.12",
                "copy 64 MiB (GB/s, read + written) 2,500", "copy 1024 MiB (GB/s, read + written) 3,012",
                "matmul bf16 8192x8192x8192 run 60 s: first half second / last third (TFLOP/s) 700.0 / 630.0 "
                "(x0.900)",
                "matmul bf16: best of the grid (TFLOP/s) 90.0 at 256x512x1024",
                "matmul bf16: published points' 4 shapes (TFLOP/s, min / median / max) 100 / 300 / 400",
                "matmul fp8: best of the grid (TFLOP/s) 12.0 at 256x256x256",
                "attention torch_flash forward (TFLOP/s by sequence) 512: 100, 1024: 200",
                "failed: matmul.fp8 RuntimeError: no fp8 units"):
        assert row in lines, row
    assert not any("published points'" in line for line in lines if "fp8" in line)
    console = Console(record=True, width=300)
    console.print(summary({**_measurement(None, False), "failed": {}}))
    text = console.export_text()
    assert "CUDA graph" not in text and "run 60 s" not in text and "failed" not in text


def test_a_compute_table_times_each_kernel_at_its_interpolated_rate_and_says_what_it_lacks():
    """common.predict.gpu_compute on a table worked by hand: rates interpolated in log2 between grid points (512 is
    halfway from 256 to 1024), held at the edges; the hardware's compute scale on every rate; the launch floor
    under every kernel, none for no work; the table's copy bandwidth on its own part, and on another part the
    fraction of the datasheet that copy reached."""
    from common.predict.gpu_compute import COMPUTE_DIR, table_from

    hw = replace(hardware_files.load("h100-sxm-8"), device_name="dev", memory_GBps=1000.0, compute_scale=0.5)
    points = [[m, n, k, 100.0 if m == 256 else 400.0] for m in (256, 1024) for n in (256, 1024) for k in (256, 1024)]
    raw = {"name": "t", "device": "dev", "launch_floor_us": 2.0, "memory": {"GBps": 3000.0, "source": "a copy"},
           "matmul": {"bf16": {"points": points}},
           "attention": {"flash": {"forward_causal": [[512, 100.0], [2048, 300.0], [8192, 500.0]],
                                   "backward": [[512, 50.0], [2048, 150.0], [8192, 250.0]]}}}
    c = table_from(raw, hw, "t.toml")
    table, flash = c.matmul["bf16"], c.attention["flash"]
    assert (table.source, flash.source, c.memory_source, c.launch_floor_s) == ("", "", "a copy", 2e-6)
    assert table.rate(512, 256, 256) == pytest.approx(250.0)
    assert (table.rate(128, 300, 2000), table.rate(4096, 300, 2000)) == (100.0, 400.0)
    assert flash.rate(1024, False) == pytest.approx(200.0) and flash.rate(4096, False) == pytest.approx(400.0)
    assert flash.rate(1024, True) == pytest.approx(100.0) and flash.rate(100, True) == 50.0
    big = Gemm("big", 4096, 4096, 4096)                   # past the grid: 400 TFLOP/s, at half scale
    assert c.gemm_s(big) == pytest.approx(big.flops / 200e12)
    assert c.gemm_s(Gemm("tiny", 256, 256, 256)) == 2e-6   # under the launch floor
    assert [c.gemm_s(Gemm("none", *dims)) for dims in ((0, 256, 256), (256, 0, 256), (256, 256, 0))] == [0.0] * 3
    assert c.attention_s("flash", 1e12, 1024, False) == pytest.approx(1e12 / 100e12)
    assert c.attention_s("flash", 1e12, 1024, True) == pytest.approx(1e12 / 50e12)
    assert (c.attention_s("flash", 0.0, 1024, True), c.attention_s("flash", 0.5, 1024, True)) == (0.0, 2e-6)
    assert c.memory_s(3e9) == pytest.approx(1e-3) and (c.memory_s(1), c.memory_s(1, 8)) == (2e-6, 16e-6)
    assert (c.memory_s(0.0), c.memory_s(0.5)) == (0.0, 2e-6)
    # Another part of a device no bundled description names keeps its datasheet bandwidth; so does this part where
    # the table measured none.
    other = table_from(raw, replace(hw, device_name="other"), "t.toml")
    assert (other.memory_Bps, other.memory_source) == (1000e9, "h100-sxm-8: memory_GBps")
    # A table measured on a bundled device (h100-sxm-8's, datasheet 3,350 GB/s) gives another part the fraction of
    # its datasheet that device's copy reached: 3,000 / 3,350 of this part's 1,000 GB/s.
    measured_h100 = table_from({**raw, "device": "NVIDIA H100 80GB HBM3"}, hw, "t.toml")
    assert measured_h100.memory_Bps == pytest.approx(1000e9 * 3000 / 3350)
    assert measured_h100.memory_source == ("h100-sxm-8: memory_GBps x 0.896, the fraction of its datasheet's 3350 "
                                           "GB/s that NVIDIA H100 80GB HBM3 reached in a copy (3000 GB/s: a copy)")
    # Without a copy measured there is no fraction: the datasheet; a copy whose source is not given says so.
    unmeasured = table_from({**raw, "device": "NVIDIA H100 80GB HBM3", "memory": {}}, hw, "t.toml")
    assert (unmeasured.memory_Bps, unmeasured.memory_source) == (1000e9, "h100-sxm-8: memory_GBps")
    unsourced = table_from({**raw, "device": "NVIDIA H100 80GB HBM3", "memory": {"GBps": 3000.0}}, hw, "t.toml")
    assert unsourced.memory_source.endswith("reached in a copy (3000 GB/s: its source not given)")
    assert table_from({**raw, "memory": {}}, hw, "t.toml").memory_Bps == 1000e9
    for call, says in ((lambda: c.gemm_s(big, "fp8"), "t: no fp8 matmul table (has bf16)"),
                       (lambda: c.attention_s("cudnn", 1.0, 512, False), "t: no attention kernel 'cudnn' (has flash)"),
                       (lambda: table_from({**raw, "memory": {}}, replace(hw, memory_GBps=None), "t.toml"),
                        "--hardware h100-sxm-8: memory_GBps is needed for memory-bound work"),
                       (lambda: compute_for(replace(hw, compute="")),
                        "--hardware h100-sxm-8: no compute table (a `compute = NAME` key naming "
                        f"{COMPUTE_DIR}/NAME.toml); use --assume-mfu"),
                       (lambda: compute_for(replace(hw, compute="/nowhere/t.toml")),
                        "--hardware h100-sxm-8: compute table /nowhere/t.toml does not exist")):
        with pytest.raises(ValueError) as refused:
            call()
        assert str(refused.value) == says
    # What a table leaves out: no name (the hardware's compute key), no sources, no copy source, no kernels.
    bare = table_from({"device": "dev", "launch_floor_us": 1.0, "memory": {"GBps": 3000.0}},
                      replace(hw, compute="t-key"), "t.toml")
    assert (bare.name, bare.launch_floor_source, bare.memory_source, bare.matmul, bare.attention) == \
        ("t-key", "", "", {}, {})
    assert table_from({"device": "dev", "launch_floor_us": 1.0}, hw, "t.toml").memory_Bps == 1000e9
    many = table_from({**raw, "matmul": {"bf16": {"points": points}, "fp16": {"points": points}},
                       "attention": {"flash": raw["attention"]["flash"], "cudnn": raw["attention"]["flash"]}}, hw, "t")
    with pytest.raises(ValueError, match=r"^t: no fp8 matmul table \(has bf16, fp16\)$"):
        many.gemm_s(big, "fp8")
    with pytest.raises(ValueError, match=r"^t: no attention kernel 'math' \(has flash, cudnn\)$"):
        many.attention_s("math", 1.0, 512, False)
    # A full grid whose three axes differ loads (each axis is checked against its own values).
    lopsided = [[m, 512, 128, 10.0] for m in (256, 1024)]
    assert table_from({**raw, "matmul": {"bf16": {"points": lopsided}}}, hw, "t").matmul["bf16"].grid == \
        ((256, 1024), (512,), (128,))
    holes = [p for p in points if tuple(p[:3]) not in {(256, 256, 1024), (256, 1024, 256), (1024, 256, 256),
                                                      (1024, 1024, 1024)}]
    with pytest.raises(ValueError) as refused:
        table_from({**raw, "matmul": {"bf16": {"points": holes}}}, hw, "t.toml")
    assert str(refused.value) == ("t.toml: matmul.bf16 is not a full grid (missing [(256, 256, 1024), (256, 1024, "
                                  "256), (1024, 256, 256)] ...)")


def test_a_decoder_describes_its_parameters_gemms_and_activations_as_counted_by_hand(tmp_path):
    """Two small decoders worked by hand: GPT-style (learned positions, LayerNorm, biases, GELU, tied output) and
    Llama-style (RoPE, RMSNorm, GQA, SwiGLU, untied output); h 64, 4 heads of 16, FFN 256, vocabulary 100,
    sequence 32."""
    gpt = decoder.DecoderSpec("g", layers=2, hidden=64, heads=4, kv_heads=4, ffn=256, ffn_kind="gelu", vocab=100,
                              seq_len=32, tied_embeddings=True, position="learned", norm="layernorm", biases=True)
    llama = replace(gpt, name="l", kv_heads=2, ffn_kind="swiglu", tied_embeddings=False, position="rope",
                    norm="rmsnorm", biases=False)
    assert (gpt.embedding_params(), llama.embedding_params()) == (100 * 64 + 32 * 64, 100 * 64)
    assert (gpt.head_params(), llama.head_params()) == (2 * 64, 64 + 100 * 64)
    assert [(g.name, g.n) for g in llama.layer_gemms(10, fused=True)] == \
        [("qkv", 64 + 2 * 32), ("wo", 64), ("fc1", 2 * 256), ("w2", 64)]
    assert [(g.name, g.n) for g in gpt.layer_gemms(10, fused=True)] == \
        [("qkv", 3 * 64), ("wo", 64), ("fc1", 256), ("w2", 64)]
    assert decoder.DecoderSpec.backward_gemms(Gemm("w1", 10, 256, 64)) == [Gemm("w1.dgrad", 10, 64, 256),
                                                                          Gemm("w1.wgrad", 64, 256, 10)]
    assert replace(gpt, vocab=101).head_gemm(10, tp=2) == Gemm("output", 10, 50, 64)
    # Per token, 2-byte values: norms' inputs 2 x 2h, QKV input 2h, Q K V 2(q + 2kv), context 2q, FFN input 2h;
    # GELU 2 x 2f, SwiGLU 4 x 2f; flash keeps 4 bytes a head, softmax without it 2 x 2 x heads x s (+1 with dropout)
    h, f, s, a = 64, 256, 32, 4
    common_gpt = 2 * 2 * h + 2 * h + 2 * 3 * h + 2 * h + 2 * h
    assert gpt.stored_activation_bytes(1) == common_gpt + 4 * a + 2 * 2 * f
    assert gpt.stored_activation_bytes(1, flash=False) == common_gpt + 4 * a * s + 2 * 2 * f
    assert gpt.stored_activation_bytes(1, flash=False, dropout=True) == \
        common_gpt + 5 * a * s + 2 * 2 * f + 2 * h
    assert llama.stored_activation_bytes(1) == 2 * 2 * h + 2 * h + 2 * (h + 2 * 32) + 2 * h + 2 * h + 4 * a + 4 * 2 * f


def test_a_model_file_is_read_or_refused_in_one_line(tmp_path):
    bundled = ", ".join(decoder.available())
    with pytest.raises(ValueError) as refused:
        decoder.load("nowhere")
    assert str(refused.value) == f"--model nowhere: no such file or bundled model (bundled: {bundled})"
    good = (tmp_path / "m.toml")
    good.write_text('name = "m"\nlayers = 2\nhidden = 64\nheads = 4\nkv_heads = 2\nffn = 256\nffn_kind = "swiglu"\n'
                    'vocab = 100\nseq_len = 32\ntied_embeddings = false\n')
    assert decoder.load(str(good)).path == str(good) and decoder.load(str(good), 64).seq_len == 64
    bad = tmp_path / "bad.toml"
    for text, says in ((good.read_text() + 'path = "x"\n', "KeyError: \"unknown keys ['path']\""),
                       (good.read_text() + 'colour = "red"\n', "KeyError: \"unknown keys ['colour']\""),
                       (good.read_text().replace("layers = 2\n", ""), "TypeError: DecoderSpec.__init__() missing 1 "
                                                                      "required positional argument: 'layers'"),
                       (good.read_text() + "layers = = 2\n", "TOMLDecodeError: ")):
        bad.write_text(text)
        with pytest.raises(ValueError) as refused:
            decoder.load(str(bad))
        assert str(refused.value).startswith(f"--model {bad}: {says}")
        assert str(refused.value).endswith(f" (format: {decoder.MODELS_DIR}/README.md)")
    for change, says in (('ffn_kind = "swiglu"', "ffn_kind 'geglu' is not one of gelu, relu, swiglu"),
                         ('kv_heads = 2', "hidden 64, heads 4, kv_heads 3 do not divide"),
                         ('tied_embeddings = false', "position 'sinusoidal' (learned|rope|alibi) or norm "
                                                     "'rmsnorm' (layernorm|rmsnorm)"),
                         ('seq_len = 32', "norm_position 'after' is not one of input, output")):
        new = {"ffn_kind": 'ffn_kind = "geglu"', "kv_heads": "kv_heads = 3",
               "tied_embeddings": 'tied_embeddings = false\nposition = "sinusoidal"',
               "seq_len": 'seq_len = 32\nnorm_position = "after"'}[change.split(" =")[0]]
        bad = tmp_path / "bad.toml"
        bad.write_text(good.read_text().replace(change, new))
        with pytest.raises(ValueError) as refused:
            decoder.load(str(bad))
        assert str(refused.value) == f"--model {bad}: {says}"
    bad.write_text(good.read_text().replace('ffn_kind = "swiglu"', 'ffn_kind = "geglu"').replace("kv_heads = 2",
                                                                                              "kv_heads = 3"))
    with pytest.raises(ValueError, match="is not one of gelu, relu, swiglu; hidden 64, heads 4, kv_heads 3 do not "
                                         "divide$"):
        decoder.load(str(bad))


def _published_result(tables: dict) -> dict:
    """check()'s answer for two points, one predicted and one refused, every figure chosen here."""
    errors = {"median_abs_error": 0.1, "max_abs_error": 0.2, "worst_median_abs_error": 0.15, "worst_max_abs_error": 0.3}
    return {"points": [{"name": "p1", "generation": "H100", "publisher": "NVIDIA", "metric": "mfu", "published": 0.5,
                        "predicted": 0.55, "error": 0.1, "error_by_table": {"t2": 0.3}, "layout_full": "fsdp8",
                        "stack": "megatron-te"},
                       {"name": "p2", "generation": "A100", "publisher": "Meta", "metric": "mfu", "published": 0.4,
                        "predicted": None, "refused": "fp8 is not modelled"}],
            **errors, "predicted": 1, "refused": 1, "tables": tables,
            "groups": [{"by": "generation", "group": "H100", "predicted": 1, "refused": 0, **errors},
                       {"by": "publisher", "group": "Meta", "predicted": 0, "refused": 1, **dict.fromkeys(errors)}],
            "rankings": [{"model": "llama3-8b", "hardware": "h100-sxm-8", "devices": 8, "points": ["a", "b"],
                          "spearman": None, "order_holds": True},
                         {"model": "gpt3-175b", "hardware": "a100-sxm-8", "devices": 64, "points": ["a", "b", "c"],
                          "spearman": 0.456, "order_holds": False}]}


def test_published_prints_the_check_s_tables_groups_and_rankings_and_writes_them(tmp_path, monkeypatch, capsys):
    from rich.console import Console

    from bench.reporting import published_plot as published_table
    from tests.test_plan_cli import _table
    result = _published_result({"h100-sxm-8": [1, 2, 3], "h100-96gb-500w-8": [1]})
    monkeypatch.setattr(published, "check", lambda: result)
    drawn = []
    monkeypatch.setattr(published_table, "published_plot",
                        lambda r: drawn.append(r) or type("Plot", (), {"png": lambda self: b"png"})())
    monkeypatch.setattr(predict_cli, "Console", lambda width: Console(width=400))
    out, json_at = tmp_path / "out", tmp_path / "elsewhere" / "p.json"
    assert predict_cli.main(["--published", "--out", str(out), "--json", str(json_at)]) == 0
    assert json.loads(json_at.read_text()) == result and drawn == [result]
    assert (out / "plots" / "predicted-vs-published.png").read_bytes() == b"png"
    lines = capsys.readouterr().out.splitlines()
    refused = lines.index(next(line for line in lines if line.startswith("refused, listed apart")))
    first = lines.index(next(line for line in lines if line.startswith("by GPU generation")))
    assert lines[0].strip() == "predicted against published GPU-cluster results"
    assert _table(lines[:refused]) == (published_table.COLUMNS, [
        ["H100", "NVIDIA", "p1", "mfu", "0.5", "0.550", "+10.0%", "+10.0% to +30.0%", "fsdp8 megatron-te"]])
    assert lines[refused].strip() == "refused, listed apart: not predicted, with why"
    assert _table(lines[refused:first]) == (published_table.REFUSED_COLUMNS, [
        ["A100", "Meta", "p2", "mfu", "0.4", "fp8 is not modelled"]])
    assert _table(lines[first:])[1] == [["generation", "H100", "1", "0", "10.0%", "20.0%", "15.0%", "30.0%"],
                                        ["publisher", "Meta", "0", "1", "", "", "", ""]]
    assert lines[-6:] == [
        f"1 points predicted, 1 refused: {published.error_line(result)} (3 tables of the H100)",
        f"generation H100: 1 predicted, 0 refused; {published.error_line(result['groups'][0])}",
        "publisher Meta: 0 predicted, 1 refused",
        "ranking llama3-8b on 8 x h100-sxm-8: Spearman n/a; order of points more than 10% apart holds (2 points)",
        "ranking gpt3-175b on 64 x a100-sxm-8: Spearman +0.46; order of points more than 10% apart DOES NOT hold "
        "(3 points)",
        f"table: {json_at}; figure: {out / 'plots' / 'predicted-vs-published.png'}"]
    # Without --json the points go beside the figure; no tables: none counted.
    monkeypatch.setattr(published, "check", lambda: _published_result({}))
    monkeypatch.chdir(tmp_path)
    assert predict_cli.main(["--published"]) == 0
    assert json.loads((tmp_path / "predictions" / "published.json").read_text())["tables"] == {}
    lines = capsys.readouterr().out.splitlines()
    assert lines[-6].endswith("(0 tables of the H100)")
    assert lines[-1] == "table: predictions/published.json; figure: predictions/plots/predicted-vs-published.png"


def test_constants_of_one_hardware_file_are_its_own_and_the_model_s(monkeypatch, capsys):
    from rich.console import Console

    from tests.test_plan_cli import _table
    monkeypatch.setattr(predict_cli, "Console", lambda width: Console(width=2000))
    assert predict_cli.main(["--constants", "--hardware", "a100-sxm-8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].strip() == "bench.predict's GPU-cluster constants"
    assert _table(lines) == (["constant", "value", "unit", "source"],
                             [[c.name, c.value, c.unit, c.source] for c in constants.table(["a100-sxm-8"])])
    assert not any(line.startswith("│ h100") for line in lines)
