"""bench.compute_table and bench.layer_check over stand-in device probes (backends.probes.Probes, the one interface
they measure through): what they ask the probes, write and print, from rates chosen here and worked by hand.
tests/test_compute_table.py runs the same commands on torch's real probes; this file imports no framework, so the
mutation run takes it."""
from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from backends import probes as probes_module
from backends.probes import Probes
from bench import compute_table, layer_check
from common.predict import compute_table as table_format
from common.predict import decoder, published, stacks
from common.predict import hardware as hardware_files
from common.predict.gpu_compute import compute_for
from common.predict.kernels import Timer, head, one_layer


class Rates:
    """The rate probes: every call noted; GEMM rates m*n*k/1000 TFLOP/s and a little more (so that rounding to four
    significant figures shows); fp8 and cuDNN attention fail as a device without them does."""

    def __init__(self, graph_us: float | None):
        self.graph_us, self.calls = graph_us, []

    def device_name(self, device):
        return f"Fake {device}"

    def software(self):
        return "fakeml 1.2"

    def launch_us(self, device):
        self.calls.append(("launch", device))
        return {"eager": 4.56789, "graph": self.graph_us}

    def copy_GBps(self, device, nbytes, target):
        self.calls.append(("copy", device, nbytes, target))
        return 1000 + nbytes / 2**20 * 234.5678

    def gemm_tflops(self, device, precision, shapes, target):
        self.calls.append(("gemm", device, precision, list(shapes), target))
        if precision == "fp8":
            raise RuntimeError("fp8 needs Hopper\nand more lines")
        return [m * n * k / 1e3 * 1.00001 for m, n, k in shapes]

    def attention_tflops(self, device, kernel, precision, seq, tokens, heads, head_dim, target):
        self.calls.append(("attention", device, kernel, precision, seq, tokens, heads, head_dim, target))
        if kernel == "torch_cudnn":
            raise ValueError("no cuDNN here\nsecond line")
        return seq * 1.5 + 0.123, seq * 2.5 + 0.0456

    def sustained_gemm(self, device, precision, m, n, k, seconds, interval):
        self.calls.append(("sustained", device, precision, m, n, k, seconds, interval))
        return [[0.5, 123.456], [1.0, 110.0], [1.5, 100.0], [2.0, 99.0], [2.5, 98.0], [3.0, 96.0], [3.5, 90.0]]


class Layers:
    """The layer probes: fixed times, every call noted."""

    def __init__(self):
        self.calls = []

    def time_layer(self, spec, device, precision, micro_batch, kernel, steps, compile, recompute):
        self.calls.append(("layer", spec.name, spec.seq_len, device, precision, micro_batch, kernel, steps, compile,
                           recompute))
        return {"forward_s": 0.002, "backward_s": 0.005, "forward_runs_s": [0.002] * steps}

    def time_head(self, spec, device, precision, micro_batch, steps):
        self.calls.append(("head", spec.name, device, precision, micro_batch, steps))
        return {"forward_s": 0.001, "backward_s": 0.003}

    def time_optimizer(self, spec, device, shards, steps):
        self.calls.append(("optimizer", spec.name, device, shards, steps))
        return {"step_s": 0.0005, "elements": 12_500_006}


@pytest.fixture
def fake(monkeypatch):
    """load_probes replaced: `kind` "cuda" (a CUDA graph's launch 2.5 us) or "cpu" (none); the devices asked noted."""
    asked = []

    def load(kind: str):
        rates, layers = Rates(2.5 if kind == "cuda" else None), Layers()

        def load_probes(device=None):
            asked.append(device)
            return Probes(f"{kind}:0", kind, rates, layers)
        monkeypatch.setattr(probes_module, "load_probes", load_probes)
        return rates, layers
    load.asked = asked
    return load


def _recorded(monkeypatch, module) -> Console:
    console = Console(record=True, width=300)
    monkeypatch.setattr(module, "Console", lambda: console)
    return console


def _rows(table) -> list[tuple[str, ...]]:
    return list(zip(*(column._cells for column in table.columns)))


def _flat(text: str) -> str:
    return " ".join(text.split())


def _cells(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]


def _help(capsys, monkeypatch, main) -> str:
    """A command's --help, one line per option (argparse wraps at hyphens too), its blanks collapsed."""
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    return _flat(capsys.readouterr().out)


# ----------------------------------------------------------------------------- bench.compute_table

def test_compute_table_options_read_lists_of_positive_integers_and_names():
    args = compute_table.build_parser().parse_args(["--json", "m.json", "--grid", "16,,32", "--precisions",
                                                    "bf16,,fp8", "--attention", "torch_math,", "--copy-bytes", "7"])
    assert args.grid == (16, 32) and args.precisions == ("bf16", "fp8") and args.attention == ("torch_math",)
    assert args.copy_bytes == (7,) and compute_table._ints("1,16") == (1, 16)
    for bad, says in (("16,x", "expected comma-separated integers, got '16,x'"),
                      ("0,16", "expected positive integers, got '0,16'"), (",", "expected positive integers, got ','")):
        with pytest.raises(Exception) as error:
            compute_table._ints(bad)
        assert str(error.value) == says and type(error.value).__name__ == "ArgumentTypeError"


def test_compute_table_defaults_are_the_h100_measurement_s(capsys):
    args = compute_table.build_parser().parse_args(["--json", "m.json"])
    assert vars(args) == {"json": "m.json", "toml": None, "name": "measured", "device": None, "precisions": None,
                          "grid": (256, 512, 1024, 2048, 4096, 8192, 16384), "published_shapes": None,
                          "attention": None, "attention_seqs": (512, 1024, 2048, 4096, 8192, 16384, 32768),
                          "attention_tokens": 16384, "attention_heads": 16,
                          "copy_bytes": (64 << 20, 256 << 20, 1 << 30),
                          "target_ms": 2.0, "sustain_s": 0.0, "sustain_shape": (8192, 8192, 8192)}
    with pytest.raises(SystemExit):
        compute_table.build_parser().parse_args(["--name", "x"])  # --json is required
    assert "the following arguments are required: --json" in capsys.readouterr().err


def test_compute_table_help_says_what_each_option_does(capsys, monkeypatch):
    assert _help(capsys, monkeypatch, compute_table.main) == _flat("""
usage: bench.compute_table [-h] --json JSON [--toml TOML] [--name NAME] [--device {cuda,cpu}] [--precisions PRECISIONS]
 [--grid GRID] [--published-shapes | --no-published-shapes] [--attention ATTENTION] [--attention-seqs ATTENTION_SEQS]
 [--attention-tokens ATTENTION_TOKENS] [--attention-heads ATTENTION_HEADS] [--copy-bytes COPY_BYTES]
 [--target-ms TARGET_MS] [--sustain-s SUSTAIN_S] [--sustain-shape SUSTAIN_SHAPE]
python -m bench.compute_table --json FILE [--toml FILE --name NAME] [--device cuda|cpu] [--precisions bf16,fp8]
options:
  -h, --help show this help message and exit
  --json JSON the measurement, written as JSON
  --toml TOML also write the compute table (hardware/compute/NAME.toml's format)
  --name NAME the compute table's name (default: measured)
  --device {cuda,cpu} default: cuda where torch sees one, else cpu
  --precisions PRECISIONS matmul precisions (bf16, fp16, fp32, fp8); default bf16,fp8 on cuda, fp32 on cpu
  --grid GRID each of m, n, k over these (default: 256 ... 16384)
  --published-shapes, --no-published-shapes also the exact GEMM shapes of bench.predict --published's points
  (default: on cuda)
  --attention ATTENTION SDPA kernels: torch_flash, torch_cudnn, torch_efficient, torch_math (default:
  torch_flash,torch_cudnn on cuda, torch_math on cpu)
  --attention-seqs ATTENTION_SEQS default: 512 ... 32768
  --attention-tokens ATTENTION_TOKENS --attention-heads ATTENTION_HEADS --copy-bytes COPY_BYTES
  --target-ms TARGET_MS each timed batch lasts about this long
  --sustain-s SUSTAIN_S first run one bf16 GEMM back to back this long, its rate sampled every half second, so that
  the table after it is measured at the clocks a long run holds (default: 0, off)
  --sustain-shape SUSTAIN_SHAPE m,n,k of that GEMM (default: 8192,8192,8192)""")


def test_a_cpu_measurement_asks_fp32_and_math_attention_at_the_target_and_rounds_to_four_figures(
        fake, tmp_path, monkeypatch):
    rates, _ = fake("cpu")
    monkeypatch.setattr("sys.argv", ["bench/compute_table.py", "--device", "cpu"])
    clock = iter([10.0, 12.34])
    monkeypatch.setattr(compute_table, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    console = _recorded(monkeypatch, compute_table)

    class Clock:   # 23:30 UTC on 2 January is already the 3rd east of Greenwich: the record's date is UTC's
        @staticmethod
        def now(tz=None):
            return datetime(2026, 1, 2, 23, 30, tzinfo=timezone.utc) if tz is timezone.utc else \
                datetime(2026, 1, 3, 1, 30)
    monkeypatch.setattr(compute_table, "datetime", Clock)
    out = tmp_path / "new" / "folder"
    assert compute_table.main(["--json", str(out / "m.json"), "--toml", str(tmp_path / "m.toml"), "--name", "here",
                               "--device", "cpu", "--grid", "16,32", "--attention-seqs", "16,32",
                               "--attention-tokens", "64", "--attention-heads", "2", "--copy-bytes", "1048576",
                               "--target-ms", "0.2"]) == 0
    assert fake.asked == ["cpu"]
    text = (out / "m.json").read_text()
    m = json.loads(text)
    assert text == json.dumps(m, indent=1) + "\n"   # a value a line: a record's diff shows what changed
    assert m.pop("date") == "2026-01-02"
    grid = [[16, 16, 16, 4.096], [16, 16, 32, 8.192], [16, 32, 16, 8.192], [16, 32, 32, 16.38],
            [32, 16, 16, 8.192], [32, 16, 32, 16.38], [32, 32, 16, 16.38], [32, 32, 32, 32.77]]
    assert m == {"device": "Fake cpu:0", "device_kind": "cpu", "software": "fakeml 1.2",
                 "command": "bench/compute_table.py --device cpu", "launch_us": {"eager": 4.56789, "graph": None},
                 "copy_GBps": {"1048576": 1234.5678}, "matmul": {"fp32": {"grid": grid, "shapes": []}},
                 "attention": {"torch_math": {"forward_causal": [[16, 24.12], [32, 48.12]],
                                              "backward": [[16, 40.05], [32, 80.05]]}},
                 "failed": {}, "seconds": 2.3}
    target = pytest.approx(2e-4, rel=1e-12)
    assert rates.calls == [
        ("launch", "cpu:0"), ("copy", "cpu:0", 1048576, target),
        ("gemm", "cpu:0", "fp32", [tuple(r[:3]) for r in grid], target), ("gemm", "cpu:0", "fp32", [], target),
        ("attention", "cpu:0", "torch_math", "fp32", 16, 64, 2, 128, target),
        ("attention", "cpu:0", "torch_math", "fp32", 32, 64, 2, 128, target)]
    # The table is the model's format of the record, its sources naming the record's file.
    assert (tmp_path / "m.toml").read_text() == table_format.toml_text(m | {"date": "2026-01-02"}, "here", "m.json")
    text = console.export_text()
    assert "matmul fp32: 8 grid shapes, 0 exact" in text
    assert ["shortest kernel from Python (us)", "4.57"] in _cells(text) and "CUDA graph" not in text
    assert text.rstrip().endswith(f"measured in 2.3 s: {out / 'm.json'}, {tmp_path / 'm.toml'}")


def test_a_cuda_measurement_sustains_first_and_notes_what_the_device_lacks(fake, tmp_path, monkeypatch):
    rates, _ = fake("cuda")
    exact = [(100, 100, 100), (400, 100, 100), (200, 100, 100), (100, 100, 300)]
    monkeypatch.setattr(published, "gemm_shapes", lambda: exact)
    console = _recorded(monkeypatch, compute_table)
    assert compute_table.main(["--json", str(tmp_path / "m.json"), "--grid", "8", "--attention-seqs", "16",
                               "--attention-tokens", "64", "--attention-heads", "2", "--copy-bytes", "1048576,3145728",
                               "--target-ms", "0.5", "--sustain-s", "3", "--sustain-shape", "64,32,16"]) == 0
    assert fake.asked == [None] and not (tmp_path / "m.toml").exists()
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["device_kind"] == "cuda" and m["launch_us"] == {"eager": 4.56789, "graph": 2.5}
    assert m["copy_GBps"] == {"1048576": 1234.5678, "3145728": pytest.approx(1703.7034)}
    # bf16 and fp8 on cuda; fp8 fails here and is noted by its first line, its table left out.
    assert m["matmul"] == {"bf16": {"grid": [[8, 8, 8, 0.512]],
                                    "shapes": [[100, 100, 100, 1000], [400, 100, 100, 4000],
                                               [200, 100, 100, 2000], [100, 100, 300, 3000]]}}
    assert m["attention"] == {"torch_flash": {"forward_causal": [[16, 24.12]], "backward": [[16, 40.05]]}}
    assert m["failed"] == {"matmul.fp8": "RuntimeError: fp8 needs Hopper",
                           "attention.torch_cudnn": "ValueError: no cuDNN here"}
    # The 7 samples' last third (2) has the median 93: 93 / 123.456 of the first.
    assert m["sustained"] == {"precision": "bf16", "shape": [64, 32, 16], "seconds": 3.0, "first_tflops": 123.5,
                              "steady_tflops": 93.0, "steady_over_first": 0.7533,
                              "series": [[0.5, 123.5], [1.0, 110.0], [1.5, 100.0], [2.0, 99.0], [2.5, 98.0],
                                         [3.0, 96.0], [3.5, 90.0]]}
    assert rates.calls[0] == ("sustained", "cuda:0", "bf16", 64, 32, 16, 3.0, 0.5)
    assert [c[2:4] for c in rates.calls if c[0] == "gemm"] == [("bf16", [(8, 8, 8)]), ("bf16", exact),
                                                               ("fp8", [(8, 8, 8)])]
    assert [c[2:5] for c in rates.calls if c[0] == "attention"] == [("torch_flash", "bf16", 16),
                                                                    ("torch_cudnn", "bf16", 16)]
    text = console.export_text()
    assert "matmul bf16: 1 grid shapes, 4 exact" in text and "matmul fp8: 0 grid shapes, 0 exact" in text
    assert text.rstrip().endswith(f"s: {tmp_path / 'm.json'}")


def test_the_published_shapes_follow_the_option_not_the_device(fake, tmp_path, monkeypatch):
    rates, _ = fake("cuda")
    monkeypatch.setattr(published, "gemm_shapes", lambda: [(100, 100, 100)])
    _recorded(monkeypatch, compute_table)
    common = ["--grid", "8", "--attention", "torch_flash", "--attention-seqs", "16", "--copy-bytes", "8",
              "--precisions", "bf16"]
    assert compute_table.main(["--json", str(tmp_path / "a.json"), "--no-published-shapes", *common]) == 0
    assert json.loads((tmp_path / "a.json").read_text())["matmul"]["bf16"]["shapes"] == []
    fake("cpu")
    assert compute_table.main(["--json", str(tmp_path / "b.json"), "--published-shapes", "--device", "cpu",
                               *common]) == 0
    assert json.loads((tmp_path / "b.json").read_text())["matmul"]["bf16"]["shapes"] == [[100, 100, 100, 1000]]


def test_the_sustained_steady_rate_is_the_median_of_the_last_third_at_least_one_sample():
    def probe(series):
        return SimpleNamespace(sustained_gemm=lambda *args: series)
    two = compute_table.sustained(probe([[0.5, 30.0], [1.0, 20.0]]), "d", "fp32", (1, 2, 3), 1.0)
    assert two["steady_tflops"] == 20.0 and two["steady_over_first"] == 0.6667   # 20 / 30 to four places
    six = compute_table.sustained(probe([[t / 2, r] for t, r in enumerate([50, 40, 40, 40, 30, 20], 1)]), "d", "fp32",
                                  (1, 2, 3), 3.0)
    assert six["steady_tflops"] == 25.0 and six["steady_over_first"] == 0.5 and six["seconds"] == 3.0


def test_a_sustain_shape_without_three_sizes_is_refused_in_a_line(fake, tmp_path, capsys):
    fake("cpu")
    with pytest.raises(SystemExit) as exit_:
        compute_table.main(["--json", str(tmp_path / "m.json"), "--sustain-shape", "64,32"])
    assert exit_.value.code == 2 and not (tmp_path / "m.json").exists()
    assert capsys.readouterr().err.endswith("error: --sustain-shape takes m,n,k, got 64,32\n")


def test_the_summary_has_a_row_for_each_figure_worked_by_hand():
    measured = {"device": "Fake", "software": "fakeml 1.2", "launch_us": {"eager": 4.56789, "graph": 2.5},
                "copy_GBps": {"1048576": 1234.5678, "3145728": 1703.7034},
                "sustained": {"precision": "bf16", "shape": [64, 32, 16], "seconds": 3.0, "first_tflops": 123.5,
                              "steady_tflops": 93.04, "steady_over_first": 0.75331},
                "matmul": {"bf16": {"grid": [[8, 8, 16, 0.9], [8, 16, 8, 1.25], [16, 8, 8, 1.1]],
                                    "shapes": [[1, 1, 1, 2000.4], [1, 1, 2, 1000.6], [1, 2, 1, 4000], [2, 1, 1, 3000]]},
                           "fp32": {"grid": [[8, 8, 8, 0.25]], "shapes": []}},
                "attention": {"torch_flash": {"forward_causal": [[16, 24.12], [32, 48.62]], "backward": [[16, 1]]}},
                "failed": {"matmul.fp8": "RuntimeError: fp8 needs Hopper"}}
    table = compute_table.summary(measured)
    assert table.title == "Fake (fakeml 1.2)" and [c.header for c in table.columns] == ["what", "measured"]
    assert _rows(table) == [
        ("shortest kernel from Python (us)", "4.57"),
        ("shortest kernel from a CUDA graph (us)", "2.50"),
        ("copy 1 MiB (GB/s, read + written)", "1,235"),
        ("copy 3 MiB (GB/s, read + written)", "1,704"),
        ("matmul bf16 64x32x16 run 3 s: first half second / last third (TFLOP/s)", "123.5 / 93.0 (x0.753)"),
        ("matmul bf16: best of the grid (TFLOP/s)", "1.2 at 8x16x8"),
        ("matmul bf16: published points' 4 shapes (TFLOP/s, min / median / max)", "1,001 / 3,000 / 4,000"),
        ("matmul fp32: best of the grid (TFLOP/s)", "0.2 at 8x8x8"),
        ("attention torch_flash forward (TFLOP/s by sequence)", "16: 24, 32: 49"),
        ("failed: matmul.fp8", "RuntimeError: fp8 needs Hopper")]
    del measured["sustained"]
    measured["launch_us"]["graph"] = None
    assert [r[0] for r in _rows(compute_table.summary(measured))[:3]] == [
        "shortest kernel from Python (us)", "copy 1 MiB (GB/s, read + written)", "copy 3 MiB (GB/s, read + written)"]


# ----------------------------------------------------------------------------- bench.layer_check

def test_layer_check_help_says_what_each_option_does(capsys, monkeypatch):
    assert _help(capsys, monkeypatch, layer_check.main) == _flat("""
usage: bench.layer_check [-h] --model MODEL --hardware HARDWARE [--stack {torch-eager,torch-compile}]
 [--micro-batch MICRO_BATCH] [--seq-len SEQ_LEN] [--device {cuda,cpu}] [--precision {bf16,fp32}]
 [--attention ATTENTION] [--part {layer,head,optimizer}] [--shards SHARDS] [--recompute {none,selective,full}]
 [--steps STEPS] [--json JSON]
python -m bench.layer_check --model NAME|FILE --hardware NAME|FILE [--part layer|head|optimizer] [--micro-batch B]
options:
  -h, --help show this help message and exit
  --model MODEL a bundled decoder (common/predict/models) or a TOML file
  --hardware HARDWARE the hardware whose compute table predicts the layer
  --stack {torch-eager,torch-compile} the software the layer runs as: torch eager, or through torch.compile
  (default: torch-eager)
  --micro-batch MICRO_BATCH sequences per step (default: 1)
  --seq-len SEQ_LEN instead of the model's sequence length
  --device {cuda,cpu} default: cuda where torch sees one, else cpu
  --precision {bf16,fp32} default: bf16 on cuda, fp32 on cpu
  --attention ATTENTION the SDPA kernel the layer runs and the compute table's rates for it (default: torch_flash
  on cuda, torch_math on cpu)
  --part {layer,head,optimizer} one decoder layer, the final norm + output layer + loss, or the optimizer's step
  over a shard (default: layer)
  --shards SHARDS --part optimizer: the FSDP degree whose 1/N of the parameters a rank updates
  --recompute {none,selective,full} activation recomputation: selective is torchtitan's op policy (default: none)
  --steps STEPS timed steps after one untimed (default: 5)
  --json JSON write the measurement and the prediction here""")


def test_layer_check_defaults(capsys):
    args = layer_check.build_parser().parse_args(["--model", "m", "--hardware", "h"])
    assert vars(args) == {"model": "m", "hardware": "h", "stack": "torch-eager", "micro_batch": 1, "seq_len": None,
                          "device": None, "precision": None, "attention": None, "part": "layer", "shards": 8,
                          "recompute": "none", "steps": 5, "json": None}
    with pytest.raises(SystemExit):
        layer_check.build_parser().parse_args(["--model", "m"])
    assert "the following arguments are required: --hardware" in capsys.readouterr().err


def test_a_layer_on_cuda_is_measured_in_bf16_flash_and_held_against_the_model(fake, tmp_path, monkeypatch):
    _, layers = fake("cuda")
    console = _recorded(monkeypatch, layer_check)
    path = tmp_path / "new" / "out" / "l.json"
    assert layer_check.main(["--model", "llama3-8b", "--hardware", "h100-sxm-8", "--micro-batch", "2",
                             "--seq-len", "1024", "--recompute", "selective", "--steps", "3", "--json", str(path)]) == 0
    assert layers.calls == [("layer", "llama3-8b", 1024, "cuda:0", "bf16", 2, "torch_flash", 3, False, "selective")]
    spec, hardware = decoder.load("llama3-8b", 1024), hardware_files.load("h100-sxm-8")
    compute = compute_for(hardware)
    predicted = one_layer(spec, stacks.load("torch-eager"), compute, hardware, 2, "bf16", "selective")
    fwd, bwd = predicted["fwd"], predicted["bwd"]
    r = json.loads(path.read_text())
    assert path.read_text() == json.dumps(r, indent=1) + "\n"   # a value a line, as bench.compute_table's
    assert r == {"model": "llama3-8b", "seq_len": 1024, "micro_batch": 2, "stack": "torch-eager", "part": "layer",
                 "recompute": "selective", "hardware": "h100-sxm-8", "compute_table": compute.path,
                 "device": "Fake cuda:0", "software": "fakeml 1.2", "precision": "bf16", "sdpa_kernel": "torch_flash",
                 "measured": {"forward_s": 0.002, "backward_s": 0.005, "forward_runs_s": [0.002] * 3},
                 "predicted": pytest.approx(predicted),
                 "error": pytest.approx({"forward": fwd / 0.002 - 1, "backward": bwd / 0.005 - 1,
                                         "layer": (fwd + bwd) / 0.007 - 1})}
    text = console.export_text()
    assert "one llama3-8b layer, 2 x 1024 tokens, SDPA torch_flash, recompute selective, Fake cuda:0 (fakeml 1.2, " \
           "torch-eager, bf16)" in _flat(text)
    assert [c.strip() for c in next(line for line in text.splitlines() if line.startswith("┃")).split("┃")[1:-1]] \
        == ["", "measured (ms)", "predicted (ms)", "error"]
    assert _cells(text) == [["forward", "2.000", f"{fwd * 1e3:.3f}", f"{fwd / 0.002 - 1:+.1%}"],
                            ["backward", "5.000", f"{bwd * 1e3:.3f}", f"{bwd / 0.005 - 1:+.1%}"],
                            ["layer", "7.000", f"{(fwd + bwd) * 1e3:.3f}", f"{(fwd + bwd) / 0.007 - 1:+.1%}"]]
    parts = ", ".join(f"{k} {predicted[k] * 1e3:.3f}" for k in ("gemm", "attention", "elementwise", "recompute"))
    assert text.rstrip().endswith(f"predicted parts (ms): {parts}")


def test_the_kernel_the_layer_runs_is_the_kernel_the_model_times(fake, tmp_path, monkeypatch):
    _, layers = fake("cuda")
    _recorded(monkeypatch, layer_check)
    path = tmp_path / "l.json"
    assert layer_check.main(["--model", "llama3-8b", "--hardware", "h100-sxm-8", "--attention", "fa2", "--stack",
                             "torch-compile", "--precision", "bf16", "--device", "cuda", "--json", str(path)]) == 0
    assert fake.asked == ["cuda"]
    assert layers.calls == [("layer", "llama3-8b", 8192, "cuda:0", "bf16", 1, "fa2", 5, True, "none")]
    spec, hardware = decoder.load("llama3-8b"), hardware_files.load("h100-sxm-8")
    stack = stacks.load("torch-compile")
    assert stack.attention_kernel != "fa2"
    predicted = one_layer(spec, replace(stack, attention_kernel="fa2"), compute_for(hardware), hardware, 1, "bf16",
                          "none")
    assert json.loads(path.read_text())["predicted"] == pytest.approx(predicted)


def test_a_kernel_the_table_has_no_rates_for_is_refused_in_a_line(fake, monkeypatch):
    _, layers = fake("cpu")
    console = _recorded(monkeypatch, layer_check)
    assert layer_check.main(["--model", "llama3-8b", "--hardware", "h100-sxm-8"]) == 2
    compute = compute_for(hardware_files.load("h100-sxm-8"))
    assert _flat(console.export_text()) == f"--attention torch_math: {compute.path} has no rates for it (has " \
        "torch_flash, torch_cudnn, fa2, cudnn)"
    assert layers.calls == []


def test_a_model_hardware_or_table_that_does_not_load_is_refused_in_a_line(fake, monkeypatch):
    fake("cuda")
    console = _recorded(monkeypatch, layer_check)
    for model, hardware, says in (
            ("no-such-model", "h100-sxm-8", "--model no-such-model: no such file or bundled model (bundled: "),
            ("llama3-8b", "no-such-hardware", "--hardware no-such-hardware: no such file or bundled description "),
            ("llama3-8b", "cpu-loopback-2core", "--hardware cpu-loopback-2core: no compute table (a `compute = NAME` "
                                                "key naming ")):
        assert layer_check.main(["--model", model, "--hardware", hardware]) == 2
        assert _flat(console.export_text(clear=True)).startswith(says)
    assert fake.asked == []


def test_the_head_is_held_against_the_model_s_norm_output_layer_and_loss(fake, tmp_path, monkeypatch):
    _, layers = fake("cuda")
    console = _recorded(monkeypatch, layer_check)
    path = tmp_path / "h.json"
    assert layer_check.main(["--model", "llama3-8b", "--hardware", "h100-sxm-8", "--part", "head", "--micro-batch",
                             "2", "--steps", "4", "--json", str(path)]) == 0
    assert layers.calls == [("head", "llama3-8b", "cuda:0", "bf16", 2, 4)]
    spec = decoder.load("llama3-8b")
    predicted = head(spec, 1, stacks.load("torch-eager"), Timer(compute_for(hardware_files.load("h100-sxm-8")), "bf16"),
                     2 * spec.seq_len)
    total = sum(predicted.values())
    r = json.loads(path.read_text())
    assert "shards" not in r and r["part"] == "head"
    assert r["measured"] == {"forward_s": 0.001, "backward_s": 0.003} and r["predicted"] == pytest.approx(predicted)
    assert r["error"] == {"head": pytest.approx(total / 0.004 - 1)}
    text = console.export_text()
    assert "llama3-8b's final norm, output layer and loss, 2 x 8192 tokens, Fake cuda:0" in _flat(text)
    assert _cells(text) == [["head", "4.000", f"{total * 1e3:.3f}", f"{total / 0.004 - 1:+.1%}"]]
    assert text.rstrip().endswith("predicted parts (ms): " + ", ".join(f"{k} {v * 1e3:.3f}"
                                                                      for k, v in predicted.items()))


def test_the_optimizer_step_is_held_against_the_model_over_a_shard(fake, tmp_path, monkeypatch):
    _, layers = fake("cpu")
    console = _recorded(monkeypatch, layer_check)
    path = tmp_path / "o.json"
    assert layer_check.main(["--model", "llama3-8b", "--hardware", "h100-sxm-8", "--part", "optimizer", "--shards",
                             "4", "--attention", "fa2", "--stack", "torch-compile", "--json", str(path)]) == 0
    assert layers.calls == [("optimizer", "llama3-8b", "cpu:0", 4, 5)]
    spec = decoder.load("llama3-8b")
    step = Timer(compute_for(hardware_files.load("h100-sxm-8"))).optimizer(spec.param_count() / 4,
                                                                            stacks.load("torch-compile"))
    r = json.loads(path.read_text())
    assert r["shards"] == 4 and r["precision"] == "fp32" and r["stack"] == "torch-compile"
    assert r["measured"] == {"step_s": 0.0005, "elements": 12_500_006}   # 12.500006 million: 13
    assert r["predicted"] == {"optimizer": pytest.approx(step)}
    assert r["error"] == {"optimizer": pytest.approx(step / 0.0005 - 1)}
    text = console.export_text()
    assert "llama3-8b's clipping and AdamW over 1/4 of its parameters (13 M elements), Fake cpu:0 (fakeml 1.2, " \
           "torch-compile, fp32)" in _flat(text)
    assert _cells(text) == [["optimizer", "0.500", f"{step * 1e3:.3f}", f"{step / 0.0005 - 1:+.1%}"]]
    assert text.rstrip().endswith(f"predicted parts (ms): optimizer {step * 1e3:.3f}")


def test_without_json_nothing_is_written(fake, tmp_path, monkeypatch):
    fake("cuda")
    _recorded(monkeypatch, layer_check)
    monkeypatch.chdir(tmp_path)
    assert layer_check.main(["--model", "llama3-8b", "--hardware", "h100-sxm-8", "--part", "head"]) == 0
    assert list(Path(tmp_path).iterdir()) == []


def _cpu_hardware(tmp_path: Path, table: Path) -> Path:
    """A hardware file of the stand-in CPU (its device name the table's, so the table's copy is its memory's)."""
    hw = tmp_path / "hw.toml"
    hw.write_text('name = "here"\ndescription = "this CPU"\ndevice_kind = "cpu"\ndevice_name = "Fake cpu:0"\n'
                  f'devices_per_node = 1\nmemory_GiB = 4\nmemory_GBps = 1\ncompute = "{table}"\n'
                  '[[link]]\nlevel = "node"\nbusbw_GBps = 1\nlatency_us = 1\nsource = "one device"\n')
    return hw


def test_a_table_measured_on_a_cpu_predicts_the_head_in_fp32_there(fake, tmp_path, monkeypatch):
    """The table bench.compute_table writes is one bench.layer_check predicts from: on a CPU, at fp32 (the only
    precision measured), with the measured copy as the memory's bandwidth."""
    _, layers = fake("cpu")
    _recorded(monkeypatch, compute_table)
    assert compute_table.main(["--json", str(tmp_path / "m.json"), "--toml", str(tmp_path / "m.toml"), "--name",
                               "cpu-here", "--grid", "16,32", "--attention-seqs", "16,32", "--copy-bytes",
                               "1048576"]) == 0
    hw = _cpu_hardware(tmp_path, tmp_path / "m.toml")
    console = _recorded(monkeypatch, layer_check)
    assert layer_check.main(["--model", "llama-tiny", "--hardware", str(hw), "--part", "head", "--json",
                             str(tmp_path / "h.json")]) == 0
    spec, compute = decoder.load("llama-tiny"), compute_for(hardware_files.load(str(hw)))
    assert compute.memory_Bps == 1235e9   # the table keeps four figures of the copy's 1234.5678 GB/s
    predicted = head(spec, 1, stacks.load("torch-eager"), Timer(compute, "fp32"), spec.seq_len)
    r = json.loads((tmp_path / "h.json").read_text())
    assert (r["precision"], r["sdpa_kernel"], r["compute_table"]) == ("fp32", "torch_math", str(tmp_path / "m.toml"))
    assert r["predicted"] == pytest.approx(predicted)
    assert layers.calls == [("head", "llama-tiny", "cpu:0", "fp32", 1, 5)]
    assert "fp32)" in console.export_text()


def test_a_sustained_run_on_a_cpu_is_of_fp32_and_any_length_above_zero(fake, tmp_path, monkeypatch):
    rates, _ = fake("cpu")
    _recorded(monkeypatch, compute_table)
    assert compute_table.main(["--json", str(tmp_path / "m.json"), "--grid", "8", "--attention-seqs", "16",
                               "--copy-bytes", "8", "--sustain-s", "0.5", "--sustain-shape", "8,8,8"]) == 0
    assert rates.calls[0] == ("sustained", "cpu:0", "fp32", 8, 8, 8, 0.5, 0.5)
    assert json.loads((tmp_path / "m.json").read_text())["sustained"]["precision"] == "fp32"


def test_a_table_without_attention_rates_says_it_has_none(fake, tmp_path, monkeypatch):
    fake("cpu")
    _recorded(monkeypatch, compute_table)
    # cuDNN attention fails on the stand-in: the table has no attention rates at all.
    assert compute_table.main(["--json", str(tmp_path / "m.json"), "--toml", str(tmp_path / "m.toml"), "--grid", "8",
                               "--attention", "torch_cudnn", "--attention-seqs", "16", "--copy-bytes", "8"]) == 0
    hw = _cpu_hardware(tmp_path, tmp_path / "m.toml")
    console = _recorded(monkeypatch, layer_check)
    assert layer_check.main(["--model", "llama-tiny", "--hardware", str(hw)]) == 2
    assert _flat(console.export_text()) == f"--attention torch_math: {tmp_path / 'm.toml'} has no rates for it " \
        "(has none)"
