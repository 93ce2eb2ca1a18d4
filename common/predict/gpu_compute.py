"""How long a GPU takes for one kernel, from the device's measured compute table (hardware/compute/<name>.toml,
bench.compute_table); docs/prediction-at-scale.md, "Compute from first principles"."""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, fields
from itertools import product
from pathlib import Path

from common.predict.hardware import GB, Hardware, datasheet_memory_GBps, tomllib
from common.spec import Gemm

COMPUTE_DIR = Path(__file__).parent / "hardware" / "compute"
TERA = 1e12


@dataclass(frozen=True)
class MatmulTable:
    grid: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
    tflops: dict[tuple[int, int, int], float]
    source: str
    exact: dict[tuple[int, int, int], float] = field(default_factory=dict)  # shapes measured as they are
    # Rates already interpolated: a plan times the same few hundred shapes for each of 10^5 layouts.
    _known: dict[tuple[float, float, float], float] = field(default_factory=dict, compare=False, repr=False)

    def rate(self, m: float, n: float, k: float) -> float:
        """TFLOP/s at a shape: as measured where the table holds the shape itself, else trilinear (_bracket)."""
        if (m, n, k) in self.exact:
            return self.exact[(m, n, k)]
        if (m, n, k) not in self._known:
            corners = [_bracket(axis, value) for axis, value in zip(self.grid, (m, n, k))]
            self._known[(m, n, k)] = sum(wm * wn * wk * self.tflops[(mi, nj, kv)]
                                         for (mi, wm), (nj, wn), (kv, wk) in product(*corners))
        return self._known[(m, n, k)]


def _bracket(axis: tuple[int, ...], value: float) -> list[tuple[int, float]]:
    """The two grid points around `value` with their weights (log2 interpolation); one at or beyond an edge."""
    if not axis[0] < value < axis[-1]:
        return [(axis[0] if value <= axis[0] else axis[-1], 1.0)]
    hi = bisect.bisect_left(axis, value)
    lo = hi - 1
    w = (math.log2(value) - math.log2(axis[lo])) / (math.log2(axis[hi]) - math.log2(axis[lo]))
    return [(axis[lo], 1.0 - w), (axis[hi], w)]


@dataclass(frozen=True)
class AttentionRates:
    forward_causal: tuple[tuple[int, float], ...]
    backward: tuple[tuple[int, float], ...]
    source: str

    def rate(self, seq: float, backward: bool) -> float:
        rates = dict(self.backward if backward else self.forward_causal)
        return sum(w * rates[s] for s, w in _bracket(tuple(rates), seq))


@dataclass(frozen=True)
class DeviceCompute:
    """A device's compute as the model times it; built from a hardware description (compute_for)."""
    name: str
    matmul: dict[str, MatmulTable]
    attention: dict[str, AttentionRates]
    launch_floor_s: float
    memory_Bps: float
    scale: float
    path: str
    launch_floor_source: str = ""
    memory_source: str = ""
    # GEMM times already worked out, by (precision, m, n, k): a plan times the same shapes for every layout. Not an
    # argument, so that a copy with another scale (dataclasses.replace) starts without them.
    _gemm_known: dict[tuple[str, int, int, int], float] = field(default_factory=dict, init=False, compare=False,
                                                                repr=False)

    def gemm_s(self, gemm: Gemm, precision: str = "bf16") -> float:
        key = (precision, gemm.m, gemm.n, gemm.k)
        known = self._gemm_known.get(key)
        if known is None:
            known = self._gemm_known[key] = self._gemm_s(gemm, precision)
        return known

    def _gemm_s(self, gemm: Gemm, precision: str) -> float:
        if precision not in self.matmul:
            raise ValueError(f"{self.name}: no {precision} matmul table (has {', '.join(self.matmul)})")
        if min(gemm.m, gemm.n, gemm.k) <= 0:
            return 0.0
        rate = self.matmul[precision].rate(gemm.m, gemm.n, gemm.k) * TERA * self.scale
        return max(gemm.flops / rate, self.launch_floor_s)

    def attention_s(self, kernel: str, flops: float, seq: float, backward: bool) -> float:
        """Flash attention of `flops` (the FA papers' convention) at the kernel's rate for the sequence length."""
        if kernel not in self.attention:
            raise ValueError(f"{self.name}: no attention kernel {kernel!r} (has {', '.join(self.attention)})")
        rate = self.attention[kernel].rate(seq, backward) * TERA * self.scale
        return max(flops / rate, self.launch_floor_s) if flops > 0 else 0.0

    def memory_s(self, nbytes: float, kernels: int = 1) -> float:
        """Memory-bound work of `nbytes` moved by `kernels` kernels at the device's bandwidth."""
        return max(nbytes / self.memory_Bps, kernels * self.launch_floor_s) if nbytes > 0 else 0.0


def arguments_of(compute: DeviceCompute) -> dict:
    """What builds `compute` again (as a subclass that records what it times, e.g.): its fields, not its known
    times."""
    return {f.name: getattr(compute, f.name) for f in fields(compute) if f.init}


def compute_for(hardware: Hardware) -> DeviceCompute:
    """The compute table a hardware description names (its `compute` key); ValueError in one line if none."""
    if not hardware.compute:
        raise ValueError(f"--hardware {hardware.name}: no compute table (a `compute = NAME` key naming "
                         f"{COMPUTE_DIR}/NAME.toml); use --assume-mfu")
    # A bundled table by name, or a file of one's own (a path ending in .toml).
    path = Path(hardware.compute) if hardware.compute.endswith(".toml") else COMPUTE_DIR / f"{hardware.compute}.toml"
    if not path.is_file():
        raise ValueError(f"--hardware {hardware.name}: compute table {path} does not exist")
    return table_from(tomllib.loads(path.read_text()), hardware, str(path))


def _memory_bandwidth(raw: dict, hardware: Hardware) -> tuple[float, str]:
    """The bandwidth memory-bound work runs at (GB/s) and its source: the table's copy where the hardware is the part
    measured; another part (another memory) at its datasheet figure times the fraction of its own datasheet the
    measured part reached, since no memory copies at its datasheet rate (the one measurement stands for both)."""
    memory = raw.get("memory", {})
    copied = float(memory.get("GBps", 0.0))
    if copied and raw.get("device") == hardware.device_name:
        return copied, memory.get("source", "")
    if not hardware.memory_GBps:
        raise ValueError(f"--hardware {hardware.name}: memory_GBps is needed for memory-bound work")
    datasheet = datasheet_memory_GBps(raw.get("device")) if copied else None
    if not datasheet:
        return hardware.memory_GBps, f"{hardware.name}: memory_GBps"
    reached = copied / datasheet
    return hardware.memory_GBps * reached, (
        f"{hardware.name}: memory_GBps x {reached:.3f}, the fraction of its datasheet's {datasheet:g} GB/s that "
        f"{raw['device']} reached in a copy ({copied:g} GB/s: {memory.get('source', 'its source not given')})")


def table_from(raw: dict, hardware: Hardware, path: str) -> DeviceCompute:
    """A compute table's content (the TOML read) as `hardware` computes with it; `path` says where it came from."""
    memory_GBps, memory_source = _memory_bandwidth(raw, hardware)
    matmul = {}
    for precision, table in raw.get("matmul", {}).items():
        points = {(int(m), int(n), int(k)): float(t) for m, n, k, t in table["points"]}
        grid = tuple(tuple(sorted({p[i] for p in points})) for i in range(3))
        missing = [(m, n, k) for m in grid[0] for n in grid[1] for k in grid[2] if (m, n, k) not in points]
        if missing:
            raise ValueError(f"{path}: matmul.{precision} is not a full grid (missing {missing[:3]} ...)")
        exact = {(int(m), int(n), int(k)): float(t) for m, n, k, t in table.get("shapes", [])}
        matmul[precision] = MatmulTable(grid=grid, tflops=points, source=table.get("source", ""), exact=exact)
    attention = {kernel: AttentionRates(tuple(map(tuple, a["forward_causal"])), tuple(map(tuple, a["backward"])),
                                        a.get("source", ""))
                 for kernel, a in raw.get("attention", {}).items()}
    return DeviceCompute(name=raw.get("name", hardware.compute), matmul=matmul, attention=attention,
                         launch_floor_s=float(raw["launch_floor_us"]) * 1e-6, memory_Bps=memory_GBps * GB,
                         scale=hardware.compute_scale, path=path,
                         launch_floor_source=raw.get("launch_floor_source", ""), memory_source=memory_source)
