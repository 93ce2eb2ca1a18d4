"""bench.compute_table and bench.layer_check on this machine's CPU: the same code that measured the H100's table
(results/reference/h100x1/compute) and held one layer against it, at small sizes."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from bench import compute_table, layer_check
from common.predict import decoder, published
from common.predict import hardware as hardware_files
from common.predict.gpu_compute import MatmulTable, compute_for

TINY = """name = "tiny-llama"
layers = 2
hidden = 64
heads = 4
kv_heads = 2
ffn = 128
ffn_kind = "swiglu"
vocab = 100
seq_len = 32
tied_embeddings = false
"""


def _hardware(path, table, device_name: str) -> str:
    path.write_text(f'name = "here"\ndescription = "this CPU"\ndevice_kind = "cpu"\ndevice_name = "{device_name}"\n'
                    f'devices_per_node = 1\nmemory_GiB = 4\nmemory_GBps = 1234\ncompute = "{table}"\n'
                    '[[link]]\nlevel = "node"\nbusbw_GBps = 1\nlatency_us = 1\nsource = "one device"\n')
    return str(path)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("compute")
    argv = ["--json", str(out / "m.json"), "--toml", str(out / "m.toml"), "--name", "cpu-here", "--device", "cpu",
            "--grid", "16,32", "--attention-seqs", "16,32", "--attention-tokens", "64", "--attention-heads", "2",
            "--copy-bytes", "65536", "--target-ms", "0.2"]
    assert compute_table.main(argv) == 0
    return out, json.loads((out / "m.json").read_text())


def test_the_probe_writes_the_table_the_model_reads(measured, tmp_path):
    out, m = measured
    assert len(m["matmul"]["fp32"]["grid"]) == 8 and not m["matmul"]["fp32"]["shapes"] and not m["failed"]
    assert set(m["attention"]) == {"torch_math"} and m["launch_us"]["graph"] is None
    c = compute_for(hardware_files.load(_hardware(tmp_path / "hw.toml", out / "m.toml", m["device"])))
    table = c.matmul["fp32"]
    for mm, n, k, tflops in m["matmul"]["fp32"]["grid"]:
        assert table.rate(mm, n, k) == pytest.approx(tflops)
    backward_at_32 = m["attention"]["torch_math"]["backward"][1][1]
    assert c.attention["torch_math"].rate(32, backward=True) == pytest.approx(backward_at_32)
    assert c.launch_floor_s == pytest.approx(m["launch_us"]["eager"] * 1e-6, rel=1e-2)
    # The measured copy is this part's bandwidth; another part keeps its datasheet figure.
    assert c.memory_Bps == pytest.approx(m["copy_GBps"]["65536"] * 1e9, rel=1e-3)
    other = compute_for(hardware_files.load(_hardware(tmp_path / "other.toml", out / "m.toml", "another part")))
    assert other.memory_Bps == 1234e9


def test_a_shape_measured_as_it_is_wins_over_the_grid():
    grid = (256, 1024)
    table = MatmulTable(grid=(grid, grid, grid), tflops={(m, n, k): 100.0 for m in grid for n in grid for k in grid},
                        source="", exact={(512, 512, 512): 40.0})
    assert table.rate(512, 512, 512) == 40.0
    assert table.rate(512, 512, 513) == pytest.approx(100.0)


def test_the_exact_shapes_are_the_gemms_the_published_points_time():
    point = next(p for p in published.all_points() if p.layout == "fsdp8-mbs2-sel")
    shapes = published.gemm_shapes([point])
    spec = decoder.load(point.model)
    forward = {(g.m, g.n, g.k) for g in spec.layer_gemms(2 * spec.seq_len)}
    backward = {(b.m, b.n, b.k) for g in spec.layer_gemms(2 * spec.seq_len) for b in spec.backward_gemms(g)}
    head = spec.head_gemm(2 * spec.seq_len)
    assert set(shapes) == forward | backward | {(head.m, head.n, head.k), (head.m, head.k, head.n),
                                                (head.k, head.n, head.m)}


def test_the_bundled_h100_table_holds_every_published_gemm():
    table = compute_for(hardware_files.load("h100-sxm-8")).matmul["bf16"]
    missing = set(published.gemm_shapes()) - set(table.exact)
    # but those predicted since their stacks were described (llm-foundry's, Float8's, Megatron-Bridge's FP8,
    # OLMo-core's): no H100 was lent since, so their shapes are read off the grid until bench.compute_table (which
    # times gemm_shapes()) measures them on one
    later = [p for p in published.all_points()
             if p.stack in ("llm-foundry", "torch-compile-float8", "megatron-bridge-fp8-cs", "olmo-core",
                            "olmo-core-float8") and "h100" in p.hardware]
    assert missing <= set(published.gemm_shapes(later))


def test_the_timed_layer_has_the_model_s_parameters(tmp_path):
    import torch  # CI installs it: a broken import fails here, never skips

    from backends.torch_common.decoder_layer import DecoderLayer
    (tmp_path / "tiny.toml").write_text(TINY)
    spec = decoder.load(str(tmp_path / "tiny.toml"))
    for s in (spec, replace(spec, ffn_kind="gelu", norm="layernorm", biases=True, position="learned"),
              replace(spec, qk_norm=True, norm_position="output")):    # OLMo 2's blocks
        layer = DecoderLayer(s)
        assert sum(p.numel() for p in layer.parameters()) == s.layer_params()
        x = torch.randn(2, s.seq_len, s.hidden)
        from backends.torch_common.decoder_layer import rope_frequencies
        assert layer(x, rope_frequencies(s.head_dim, s.seq_len, "cpu")).shape == x.shape
    # OLMo 2's block by hand: each branch's output normalised before its residual add; and Q normalised before
    # the scores (its norm's weight 0: every score 0, so each position takes the mean of V up to it)
    olmo, freqs = DecoderLayer(s), rope_frequencies(s.head_dim, s.seq_len, "cpu")
    with torch.no_grad():
        h = x + olmo.attention_norm(olmo.attention(x, freqs))
        assert torch.allclose(olmo(x, freqs), h + olmo.ffn_norm(olmo.feed_forward(h)), atol=1e-5)
        olmo.q_norm.weight.zero_()
        v = (olmo.wv(x).view(2, s.seq_len, s.kv_heads, s.head_dim)      # each K/V head serves its run of heads
             .repeat_interleave(s.heads // s.kv_heads, dim=2).flatten(2))
        means = v.cumsum(1) / torch.arange(1, s.seq_len + 1)[None, :, None]
        assert torch.allclose(olmo.attention(x, freqs), olmo.wo(means), atol=1e-5)


def test_layer_check_holds_a_measured_layer_against_the_model(measured, tmp_path):
    out, m = measured
    (tmp_path / "tiny.toml").write_text(TINY)
    hw = _hardware(tmp_path / "hw.toml", out / "m.toml", m["device"])
    argv = ["--model", str(tmp_path / "tiny.toml"), "--hardware", hw, "--micro-batch", "2", "--steps", "2",
            "--json", str(tmp_path / "l.json")]
    assert layer_check.main(argv) == 0
    r = json.loads((tmp_path / "l.json").read_text())
    assert r["sdpa_kernel"] == "torch_math" and r["precision"] == "fp32"
    meas, pred = r["measured"], r["predicted"]
    assert len(meas["forward_runs_s"]) == 2 and meas["forward_s"] > 0 and meas["backward_s"] > 0
    assert pred["gemm"] > 0 and pred["attention"] > 0 and pred["elementwise"] > 0
    assert pred["fwd"] + pred["bwd"] == pytest.approx(pred["gemm"] + pred["attention"] + pred["elementwise"])
    assert r["error"]["layer"] == pytest.approx((pred["fwd"] + pred["bwd"]) / (meas["forward_s"] + meas["backward_s"])
                                                - 1)
    assert layer_check.main(argv[:-2] + ["--attention", "torch_flash"]) == 2  # no rates for it: refused in a line


def test_selective_recompute_redoes_every_second_matmul_and_keeps_the_gradients(tmp_path):
    import torch  # CI installs it: a broken import fails here, never skips
    from torch.utils._python_dispatch import TorchDispatchMode

    from backends.torch_common.decoder_layer import Checkpointed, DecoderLayer, rope_frequencies

    class CountMatmuls(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls += func == torch.ops.aten.mm.default
            return func(*args, **(kwargs or {}))

    (tmp_path / "tiny.toml").write_text(TINY)
    spec = decoder.load(str(tmp_path / "tiny.toml"))
    torch.manual_seed(0)
    plain = DecoderLayer(spec)
    x = torch.randn(2, spec.seq_len, spec.hidden, requires_grad=True)
    freqs = rope_frequencies(spec.head_dim, spec.seq_len, "cpu")
    seen = {}
    for recompute in ("none", "selective"):
        layer = plain if recompute == "none" else Checkpointed(plain, recompute)
        x.grad, plain.wq.weight.grad = None, None
        out = layer(x, freqs)
        with CountMatmuls() as counted:
            out.sum().backward()
        seen[recompute] = counted.calls, x.grad.clone(), plain.wq.weight.grad.clone()
    linears = len(spec.linears())
    assert seen["none"][0] == 2 * linears                          # dgrad and wgrad of each
    assert seen["selective"][0] == 2 * linears + linears // 2      # wk, wo, w3 again: every second forward matmul
    for plain_grad, recomputed_grad in zip(seen["none"][1:], seen["selective"][1:]):
        assert torch.allclose(plain_grad, recomputed_grad)


def test_the_rest_of_a_rank_s_step_is_checked_by_part(measured, tmp_path):
    out, m = measured
    (tmp_path / "tiny.toml").write_text(TINY)
    spec = decoder.load(str(tmp_path / "tiny.toml"))
    hw = _hardware(tmp_path / "hw.toml", out / "m.toml", m["device"])
    base = ["--model", str(tmp_path / "tiny.toml"), "--hardware", hw, "--steps", "2"]
    assert layer_check.main(base + ["--part", "optimizer", "--shards", "4", "--json", str(tmp_path / "o.json")]) == 0
    opt = json.loads((tmp_path / "o.json").read_text())
    # A rank updates its shard of every parameter: the model's count, each tensor rounded up.
    tensors = len(spec.linears()) * spec.layers + 2 * spec.layers + 1 + 2
    assert spec.param_count() / 4 <= opt["measured"]["elements"] < spec.param_count() / 4 + tensors
    assert opt["error"]["optimizer"] == pytest.approx(opt["predicted"]["optimizer"] / opt["measured"]["step_s"] - 1)
    assert layer_check.main(base + ["--part", "head", "--json", str(tmp_path / "h.json")]) == 0
    head = json.loads((tmp_path / "h.json").read_text())
    assert set(head["predicted"]) == {"gemm", "loss", "norm"} and head["measured"]["backward_s"] > 0


def test_a_sustained_run_is_sampled_through_its_length_and_noted_in_the_table(measured, tmp_path):
    argv = ["--json", str(tmp_path / "s.json"), "--toml", str(tmp_path / "s.toml"), "--device", "cpu", "--grid", "16",
            "--attention-seqs", "16", "--attention-tokens", "64", "--attention-heads", "2", "--copy-bytes", "65536",
            "--target-ms", "0.2", "--sustain-s", "3", "--sustain-shape", "64,32,16"]
    assert compute_table.main(argv) == 0
    run = json.loads((tmp_path / "s.json").read_text())["sustained"]
    times = [t for t, _ in run["series"]]
    assert run["shape"] == [64, 32, 16] and len(times) >= 4 and 1.5 < times[-1] < 3
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    # A sample each half second: on a busy machine one may stretch, and the one after it is as much shorter (each
    # batch is sized by the last one's rate); on CI's two loaded cores the median gap reached 0.81 s. Up to twice
    # the interval: a sampler that waits a second or more between samples still fails it.
    assert 0.2 < gaps[len(gaps) // 2] < 1.0
    rates = sorted(r for _, r in run["series"][-(len(times) // 3):])
    assert run["first_tflops"] == run["series"][0][1]
    assert run["steady_tflops"] == pytest.approx(rates[len(rates) // 2] if len(rates) % 2 else
                                                 (rates[len(rates) // 2 - 1] + rates[len(rates) // 2]) / 2, rel=1e-3)
    assert "in its first half second" in (tmp_path / "s.toml").read_text()
    assert "Measured without a sustained load first" in (measured[0] / "m.toml").read_text()


def test_a_transient_costs_one_batch_of_a_few_shapes_not_a_shape_s_median(monkeypatch):
    """The table's GEMMs are timed in passes through all the shapes: a stall that spans six consecutive
    batches (a host hiccup, a clock dip) lands in one batch each of six shapes, and every median stays."""
    import torch

    from backends.torch_common import compute_probe as probe
    timed = []

    def batch_s(device, fn, calls):
        timed.append(len(timed))
        return 10.0 if 12 <= len(timed) - 1 < 18 else 1.0
    monkeypatch.setattr(probe, "_batch_s", batch_s)
    shapes = [(16 * i, 16, 16) for i in range(1, 9)]
    rates = probe.gemm_tflops(torch.device("cpu"), "fp32", shapes, 1e-4)
    assert len(timed) == 8 * probe.BATCHES
    assert rates == pytest.approx([2.0 * m * n * k / 1.0 / 1e12 for m, n, k in shapes])
