"""Dense peak FLOP/s per accelerator model and math mode, and model FLOP utilisation (MFU) from them.

Every figure is the vendor datasheet's DENSE rate (the 2:4 structured-sparsity figure that datasheets
print beside it is twice this and is never used here). A device not in the table, or a math mode the
device has no units for (bf16 on a V100 or T4), gives None: an MFU is never computed from a guess.
CPUs give None too: their peak depends on cores, clocks and vector units no record pins down.

Math modes: "bf16" and "fp16" (tensor cores), "tf32" (float32 storage on tensor cores, what
cuDNN convolutions and TF's float32 matmuls use by default on Ampere and later) and "fp32" (plain
float32 units, torch's float32 matmul default, `torch.get_float32_matmul_precision() == "highest"`).
"""
from __future__ import annotations

import re

TERA = 1e12

# (pattern on the device name as the driver reports it, model name, {math mode: dense TFLOP/s}).
# First match wins, so more specific names come first.
PEAK_TFLOPS: tuple[tuple[str, str, dict[str, float]], ...] = (
    # NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): H200 SXM FP32 67, TF32 989*,
    # BF16/FP16 1,979* (* with sparsity); H200 NVL FP32 60, TF32 835*, BF16/FP16 1,671*.
    (r"H200 NVL", "H200 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}),
    (r"H200", "H200 SXM", {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5}),
    # NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100): H100 SXM FP32 67, TF32 989*,
    # BF16/FP16 1,979*; H100 NVL FP32 60, TF32 835*, BF16 1,671*; H100 PCIe (datasheet of 2022)
    # FP32 51, TF32 756*, BF16/FP16 1,513*. The SXM part reports itself as "H100 80GB HBM3".
    (r"H100 NVL", "H100 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}),
    (r"H100.*PCIe", "H100 PCIe", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0}),
    (r"H100.*(SXM|HBM3)", "H100 SXM", {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5}),
    # NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100), SXM and PCIe alike: FP32 19.5,
    # TF32 156 (312*), BF16/FP16 312 (624*).
    (r"A100", "A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    # NVIDIA L40S datasheet: FP32 91.6, TF32 183 (366*), BF16/FP16 362.05 (733*).
    (r"L40S", "L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05}),
    # NVIDIA L4 datasheet: FP32 30.3, TF32 60 (120*), BF16/FP16 121 (242*).
    (r"\bL4\b", "L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0}),
    # NVIDIA A10 datasheet: FP32 31.2, TF32 62.5 (125*), BF16/FP16 125 (250*).
    (r"\bA10\b", "A10", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}),
    # NVIDIA V100 datasheet: SXM2 FP32 15.7, tensor (FP16) 125; PCIe FP32 14, tensor 112;
    # V100S PCIe FP32 16.4, tensor 130. Volta has no bf16 or tf32 units.
    (r"V100S", "V100S PCIe", {"fp32": 16.4, "fp16": 130.0}),
    (r"V100.*PCIE", "V100 PCIe", {"fp32": 14.0, "fp16": 112.0}),
    (r"V100", "V100 SXM2", {"fp32": 15.7, "fp16": 125.0}),
    # NVIDIA T4 datasheet: FP32 8.1, mixed precision (FP16/FP32) 65. Turing has no bf16 or tf32.
    (r"\bT4\b", "T4", {"fp32": 8.1, "fp16": 65.0}),
)

# The math mode a run's --precision puts its matrix products in (fp32: see the module docstring).
PRECISION_MATH = {"amp": "bf16", "fp16": "fp16", "fp32": "fp32"}


def device_model(name: str | None) -> tuple[str, dict[str, float]] | None:
    """(model, {math mode: dense TFLOP/s}) for a device name, or None when it is not in the table."""
    for pattern, model, peaks in PEAK_TFLOPS:
        if name and re.search(pattern, name, re.IGNORECASE):
            return model, peaks
    return None


def peak_flops(name: str | None, math: str) -> float | None:
    """Dense peak FLOP/s of one device in one math mode, or None (unknown device or no such units)."""
    found = device_model(name)
    tflops = found[1].get(math) if found else None
    return tflops * TERA if tflops else None


def mfu(achieved_flops: float | None, device_kind: str, device_name: str | None, physical_devices: int,
        math: str) -> dict:
    """MFU = achieved FLOP/s / (physical devices x one device's peak), with what it rests on.

    Virtual devices count once per physical device: N processes sharing ONE GPU share one peak.
    """
    basis = {"device_model": None, "math": math, "peak_flops_per_device": None,
             "physical_devices": physical_devices}
    if device_kind != "cuda":
        return {"mfu": None, "basis": {**basis, "why_null": f"no peak is known for {device_kind} devices"}}
    found = device_model(device_name)
    if math == "tf32" and found and "tf32" not in found[1]:
        math = basis["math"] = "fp32"  # TF32 allowed on a GPU without TF32 units: its float32 runs on fp32 units
    peak = peak_flops(device_name, math)
    basis.update(device_model=found[0] if found else None, peak_flops_per_device=peak)
    if peak is None:
        why = f"{device_name!r} is not in common.peak_flops" if not found else f"{found[0]} has no {math} units"
        return {"mfu": None, "basis": {**basis, "why_null": why}}
    value = achieved_flops / (physical_devices * peak) if achieved_flops else None
    return {"mfu": value, "basis": basis}
