"""common.achievable: the measured matmul peak, the budget that keeps the probe short, and the MFU against it."""
from __future__ import annotations

import time

import pytest
import torch

from backends.torch_common.matmul import time_matmul
from common.achievable import achievable_section, matmul_flops, mfu_achievable, probe


def test_a_real_cpu_probe_is_short_and_reaches_a_plausible_rate():
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    found = probe(lambda n, r: time_matmul(torch.device("cpu"), "fp32", n, r), (64, 128), 3, 0.5)
    assert time.perf_counter() - t0 < 1.0
    assert found["precision"] == "fp32" and found["shape"][0] in (64, 128)
    assert set(found["tried"]) == {"64", "128"}
    # One core does more than 10^8 and less than 10^12 float32 FLOP/s.
    assert 1e8 < found["flops_per_s"] < 1e12
    assert found["flops_per_s"] == max(found["tried"].values())


def test_the_budget_stops_before_a_size_that_would_outgrow_it():
    calls = []

    def timed(n, repeats):
        calls.append(n)
        return "fp32", [n ** 3 * 1e-9] * repeats  # 1 ns per multiply-add

    found = probe(timed, (100, 200, 400), 4, budget_s=0.05)
    # 100^3 ns = 1 ms a product; 200: 5 x 8 ms = 40 ms predicted, within 50 ms; 400: 5 x 64 ms, not
    assert calls == [100, 200]
    assert found["flops_per_s"] == pytest.approx(matmul_flops(100) / 1e-3)


def test_the_section_and_the_mfu_against_it():
    ranks = [{"flops_per_s": 4e10, "precision": "bf16", "shape": [512] * 3, "tried": {"256": 3e10, "512": 4e10}},
             {"flops_per_s": 2e10, "precision": "bf16", "shape": [512] * 3, "tried": {"256": 1e10, "512": 2e10}},
             None]
    section = achievable_section(ranks, "cpu", 1)
    assert section["flops_per_s"] == pytest.approx(3e10) and section["per_rank"] == [4e10, 2e10, None]
    assert section["precision"] == "bf16" and section["shape"] == [512, 512, 512]
    assert "1 thread(s) per device" in section["method"]
    # 3 devices of 3e10 each: 1.8e10 achieved is 20%
    assert mfu_achievable(1.8e10, 3, section) == pytest.approx(0.2)
    assert mfu_achievable(None, 3, section) is None and mfu_achievable(1e9, 3, None) is None
    assert achievable_section([None, None], "cpu", 1) is None
