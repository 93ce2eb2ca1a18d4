"""MFU rests on the datasheet table: a known device gives its dense peak, anything else gives null."""
from __future__ import annotations

import pytest

from common.peak_flops import TERA, mfu, peak_flops


@pytest.mark.parametrize("name,math,tflops", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.5),  # the SXM part, as its driver names it
    ("NVIDIA H100 PCIe", "bf16", 756.0),
    ("NVIDIA H200", "tf32", 494.5),
    ("NVIDIA A100-SXM4-80GB", "fp32", 19.5),
    ("NVIDIA L4", "fp16", 121.0),
    ("Tesla V100-SXM2-16GB", "fp16", 125.0),
    ("Tesla T4", "fp16", 65.0),
])
def test_known_devices_give_the_table_value(name, math, tflops):
    assert peak_flops(name, math) == tflops * TERA


@pytest.mark.parametrize("name,math", [("NVIDIA GeForce GTX 1080", "fp32"), ("Tesla T4", "bf16"), (None, "bf16")])
def test_unknown_device_or_missing_units_give_none(name, math):
    assert peak_flops(name, math) is None
    assert mfu(1e12, "cuda", name, 1, math)["mfu"] is None


def test_mfu_divides_by_the_physical_devices_and_is_null_on_cpu():
    achieved = 0.25 * 989.5 * TERA
    assert mfu(achieved, "cuda", "NVIDIA H100 80GB HBM3", 1, "bf16")["mfu"] == pytest.approx(0.25)
    assert mfu(achieved, "cuda", "NVIDIA H100 80GB HBM3", 2, "bf16")["mfu"] == pytest.approx(0.125)
    on_cpu = mfu(achieved, "cpu", None, 1, "fp32")
    assert on_cpu["mfu"] is None and "cpu" in on_cpu["basis"]["why_null"]


def test_tf32_allowed_on_a_gpu_without_tf32_units_counts_against_its_fp32_peak():
    found = mfu(0.5 * 15.7 * TERA, "cuda", "Tesla V100-SXM2-16GB", 1, "tf32")
    assert found["mfu"] == pytest.approx(0.5) and found["basis"]["math"] == "fp32"
