"""Every constant the GPU-cluster model uses, in one table (value, unit, source): bench.predict --constants, each
read from where it is defined once. None is fitted to the published results; an assumption's source says so."""
from __future__ import annotations

from dataclasses import dataclass

from common.peak_flops import peak_flops
from common.predict import hardware as hardware_files
from common.predict import kernels, published
from common.predict.gpu_compute import compute_for
from common.predict.stacks import STACKS


@dataclass(frozen=True)
class Constant:
    name: str
    value: str
    unit: str
    source: str


def gpu_hardware() -> list[str]:
    """The bundled hardware descriptions that have a compute table."""
    return [n for n in hardware_files.available() if hardware_files.load(n).compute]


def hardware_constants(name: str) -> list[Constant]:
    hw = hardware_files.load(name)
    src = "; ".join(hw.sources[:1])
    out = [Constant(f"{name}: devices per node", str(hw.devices_per_node), "", src),
           Constant(f"{name}: memory per device", f"{hw.memory_bytes / 2**30:.1f}", "GiB", src),
           Constant(f"{name}: memory bandwidth", f"{hw.memory_GBps:g}", "GB/s", "datasheet; memory-bound work runs "
                    f"at the compute table's copy on this part, else at this times the fraction of its datasheet the "
                    f"table's part reached (below); {src}")]
    peak = peak_flops(hw.device_name, "bf16")
    if peak:
        out.append(Constant(f"{name}: bf16 dense peak (--assume-mfu, MFU)", f"{peak / 1e12:g}", "TFLOP/s",
                            "common.peak_flops (NVIDIA datasheet)"))
    for link in hw.links:
        out += [Constant(f"{name}: {link.level} bus bandwidth", f"{link.busbw_GBps:g}", "GB/s", link.source),
                Constant(f"{name}: {link.level} latency per ring step", f"{link.latency_s * 1e6:g}", "us", link.source)]
    if hw.compute:
        out += [Constant(f"{name}: compute table", hw.compute, "", f"hardware/compute/{hw.compute}.toml"),
                Constant(f"{name}: compute scale", f"{hw.compute_scale:g}", "x table",
                         hw.compute_scale_source or "the part the table was measured on")]
    return out


def compute_constants(hardware_name: str) -> list[Constant]:
    c = compute_for(hardware_files.load(hardware_name))
    out = [Constant(f"{c.name}: kernel launch floor", f"{c.launch_floor_s * 1e6:g}", "us", c.launch_floor_source),
           Constant(f"{hardware_name}: memory bandwidth of memory-bound work", f"{c.memory_Bps / 1e9:g}", "GB/s",
                    c.memory_source)]
    for precision, table in c.matmul.items():
        rates, edge = table.tflops.values(), table.tflops[tuple(axis[-1] for axis in table.grid)]
        out.append(Constant(f"{c.name}: {precision} matmul rate, {len(table.tflops)} shapes "
                            f"{table.grid[0][0]}-{table.grid[0][-1]} per dimension",
                            f"{min(rates):.1f}-{max(rates):.1f} (at the largest: {edge:.1f})", "TFLOP/s", table.source))
        if table.exact:
            exact = sorted(table.exact.values())
            out.append(Constant(f"{c.name}: {precision} matmul rate at {len(exact)} exact shapes (the published "
                                "points' GEMMs)", f"{exact[0]:.1f}-{exact[-1]:.1f} (median "
                                f"{exact[len(exact) // 2]:.1f})", "TFLOP/s", table.source))
    for kernel, rates in c.attention.items():
        for what, points in (("forward (causal)", rates.forward_causal), ("backward", rates.backward)):
            out.append(Constant(f"{c.name}: {kernel} attention {what}, by sequence",
                                ", ".join(f"{s}: {r:g}" for s, r in points), "TFLOP/s", rates.source))
    return out


STACK_UNITS = {"attention_kernel": "", "fused_projections": "", "elementwise_kernels": "/layer",
               "backward_factor": "x forward bytes", "logit_bytes": "B/logit", "selective": "",
               "optimizer_bytes": "B/element", "fsdp_gather_copy_bytes": "B/element",
               "fsdp_scatter_copy_bytes": "B/element", "grad_reduce_bytes": "B/element",
               "logit_live_bytes": "B/logit"}
FLOAT8_UNITS = {"cast_bytes": "B/element", "amax_bytes": "B/element", "transpose_bytes": "B/element",
                "gather_bytes": "B/element", "scale_bytes": "B/element", "kernels_forward": "/layer",
                "transpose_in_cast": "", "amax_unfused": "", "weights_in_fp8": ""}
CONTEXT_PARALLEL_UNITS = {"kv_repeated": "", "grad_bytes": "B/element", "merge_once": "B/element",
                          "merge_step": "B/element/step", "send_copy": "B/element/step", "grad_once": "B/element",
                          "grad_q_step": "B/element/step", "grad_kv_first": "B/element",
                          "grad_kv_step": "B/element/step", "kernels_forward": "/step",
                          "kernels_backward": "/step"}


def stack_constants() -> list[Constant]:
    out = []
    for s in STACKS.values():
        out += [Constant(f"{s.name}: {field}", str(getattr(s, field)), unit, s.source)
                for field, unit in STACK_UNITS.items()]
        out.append(Constant(f"{s.name}: elementwise bytes per token and layer (forward)", s.elementwise_formula,
                            "B", s.source))
        if s.float8:
            out += [Constant(f"{s.name}: float8 {field}", str(getattr(s.float8, field)), unit, s.float8.source)
                    for field, unit in FLOAT8_UNITS.items()]
        if s.context_parallel:
            out += [Constant(f"{s.name}: context parallel {field}", str(getattr(s.context_parallel, field)), unit,
                             s.context_parallel.source) for field, unit in CONTEXT_PARALLEL_UNITS.items()]
        if s.tp_overlap_split:
            out.append(Constant(f"{s.name}: GEMMs split by overlapped tensor-parallel communication",
                                ", ".join(f"{g}: {k}" for g, k in s.tp_overlap_split), "chunks", s.tp_overlap_source))
    return out


def model_constants() -> list[Constant]:
    return [Constant("flash attention backward FLOPs", f"{kernels.FLASH_BACKWARD:g}", "x forward",
                     "Dao 2023, FlashAttention-2, section 3 (the backward's 5 matmuls to the forward's 2); the FA "
                     "papers' TFLOP/s convention"),
            Constant("Megatron gradient bucket", f"{kernels.MEGATRON_BUCKET_PARAMS:g}", "parameters",
                     "megatron/core/distributed/distributed_data_parallel.py (core_r0.8.0): max(40M, 1M x dp)"),
            Constant("Megatron MFU peak", f"{published.MEGATRON_PEAK / 1e12:g}", "TFLOP/s",
                     "H100 SXM dense bf16 (NVIDIA datasheet); the Megatron table's 408.8 / 989 = 41%"),
            Constant("ranking margin", f"{published.ORDER_MARGIN:g}", "relative",
                     "issue 31: layout order must agree where published figures differ by more than 10%")]


def table(hardware: list[str] | None = None) -> list[Constant]:
    rows: list[Constant] = []
    computes = set()
    for name in hardware or gpu_hardware():
        rows += hardware_constants(name)
        compute = hardware_files.load(name).compute
        if compute and compute not in computes:
            computes.add(compute)
            rows += compute_constants(name)
    return rows + stack_constants() + model_constants()
