"""bench.part_check on this machine's CPU at small sizes: the one command a lent GPU runs to measure its part's compute
table and hold the layer checks to it."""
from __future__ import annotations

import json

import pytest

from bench import part_check
from common.peak_flops import device_model
from common.predict import hardware as hardware_files
from common.predict.gpu_compute import compute_for
from tests.test_compute_table import TINY
from tests.test_gpu_telemetry import stand_in

SMALL_TABLE = ["--grid", "16,32", "--attention-seqs", "16,32", "--attention-tokens", "64", "--attention-heads", "2",
               "--copy-bytes", "65536", "--target-ms", "0.2", "--sustain-shape", "64,32,16"]


def test_the_table_measured_is_the_one_the_checks_are_held_to(tmp_path, monkeypatch):
    """With a stand-in for nvidia-smi (tests/test_gpu_telemetry.py): its state and trace beside the table."""
    pids = stand_in(tmp_path, monkeypatch)
    (tmp_path / "tiny.toml").write_text(TINY)
    hardware = tmp_path / "here-1.toml"
    # a part's file as bundled: its own compute key (a table this command must not use), the device as it names it
    hardware.write_text('name = "here-1"\ndevice_kind = "cpu"\ndevice_name = "a CPU"\ndevices_per_node = 1\n'
                        'memory_GiB = 4\nmemory_GBps = 1234\ncompute = "h100-sxm"\n'
                        '[[link]]\nlevel = "node"\nbusbw_GBps = 1\nlatency_us = 1\nsource = "one device"\n')
    out = tmp_path / "out"
    checks = "llama3-8b-layer,llama3-8b-head,llama3-8b-optimizer"
    argv = ["--hardware", str(hardware), "--out", str(out), "--device", "cpu", "--sustain-s", "1", "--steps", "2",
            "--checks", checks, "--model", str(tmp_path / "tiny.toml"), "--", *SMALL_TABLE]
    assert part_check.main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == ["checks.json", "compute.json", "hardware.toml", "here.toml",
                                                     "nvidia-smi-trace.csv", "nvidia-smi.txt", "part-check.md"]
    assert len(pids.read_text().split()) == 2  # asked once, then sampling throughout
    measured = json.loads((out / "compute.json").read_text())
    assert measured["sustained"]["shape"] == [64, 32, 16] and len(measured["matmul"]["fp32"]["grid"]) == 8
    # the hardware file as given, its table the one just measured
    part = hardware_files.load(str(out / "hardware.toml"))
    assert part.name == "here-1" and part.memory_GBps == 1234 and part.compute == str((out / "here.toml").resolve())
    assert compute_for(part).matmul["fp32"].rate(32, 32, 32) == pytest.approx(
        next(r[3] for r in measured["matmul"]["fp32"]["grid"] if r[:3] == [32, 32, 32]))
    records = json.loads((out / "checks.json").read_text())
    assert [r["check"] for r in records] == checks.split(",")
    assert {r["compute_table"] for r in records} == {str((out / "here.toml").resolve())}
    assert {r["model"] for r in records} == {"tiny-llama"} and [r["part"] for r in records] == [
        "layer", "head", "optimizer"]
    assert records[0]["micro_batch"] == 2 and records[2]["shards"] == 8
    text = (out / "part-check.md").read_text()
    for r in records:
        for name, error in r["error"].items():
            assert f"| {r['check']} | tiny-llama | {name} |" in text and f"{error:+.1%} |" in text
    assert "sustained 64x32x16 GEMM" in text
    assert "NVIDIA H200, 143771 MiB, 700.00 W, 1980 MHz, 3201 MHz, 580.159.04" in text
    trace = (out / "nvidia-smi-trace.csv").read_text().splitlines()
    assert len(trace) > 4 and f"nvidia-smi trace: {len(trace) - 1} samples; power draw up to 650 W" in text


def test_without_nvidia_smi_the_summary_says_so(tmp_path):
    (tmp_path / "tiny.toml").write_text(TINY)
    argv = ["--hardware", "h100-sxm-8", "--out", str(tmp_path / "out"), "--device", "cpu", "--sustain-s", "0",
            "--steps", "1", "--checks", "llama3-8b-optimizer", "--model", str(tmp_path / "tiny.toml"), "--",
            *SMALL_TABLE]
    assert part_check.main(argv) == 0
    assert "nvidia-smi: not on this machine (no power limit, clocks or trace)" in (
        tmp_path / "out" / "part-check.md").read_text()
    assert not list((tmp_path / "out").glob("nvidia-smi*"))


def test_a_check_not_known_is_refused_before_anything_is_measured(tmp_path, capsys):
    with pytest.raises(SystemExit):
        part_check.main(["--hardware", "h100-sxm-8", "--out", str(tmp_path / "o"), "--checks", "llama3-8b-lyer"])
    assert "unknown checks ['llama3-8b-lyer']" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_the_table_is_named_in_place_of_the_file_s_own():
    text = 'name = "x-8"\ncompute = "old"\n[[link]]\nlevel = "node"\n'
    new = part_check.with_table(text, part_check.Path("/t/new.toml"))
    assert new.count("compute =") == 1 and new.startswith('compute = "/t/new.toml"') and 'name = "x-8"' in new


def test_the_h200_waits_for_its_table_in_one_line_and_is_rated_as_the_sxm_part():
    h200 = hardware_files.load("h200-sxm-8")
    with pytest.raises(ValueError) as refused:
        compute_for(h200)
    assert str(refused.value).startswith("--hardware h200-sxm-8: no compute table") and "\n" not in str(refused.value)
    assert device_model(h200.device_name)[0] == "H200 SXM" and h200.memory_GBps == 4800
    # what the command measures on it is the part this file names: its copy is the part's own bandwidth
    assert 140 * 2**30 <= h200.memory_bytes < 141 * 2**30 and h200.devices_per_node == 8
