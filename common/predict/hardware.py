"""A machine as the model sees it (device, memory, links, compute table), read from a TOML file (format:
hardware/README.md); every figure names its source."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as a package (pyproject's tomli)
    import tomli as tomllib

HARDWARE_DIR = Path(__file__).parent / "hardware"
GB = 1e9


@dataclass(frozen=True)
class Link:
    level: str            # "node" (within a node) or "network" (between nodes)
    busbw_GBps: float     # bus bandwidth per device, 1e9 bytes/s
    latency_s: float      # per message step of a collective
    source: str = ""
    # Kinds a probe timed apart, at their own bus bandwidth (Gloo's reduce-scatter and all-gather are no ring)
    busbw_by_kind: dict[str, float] = field(default_factory=dict, hash=False)

    def busbw(self, kind: str) -> float:
        return self.busbw_by_kind.get(kind, self.busbw_GBps)


@dataclass(frozen=True)
class Hardware:
    name: str
    description: str
    device_kind: str                 # cpu | cuda, as records say
    device_name: str                 # as the driver reports it (common.peak_flops looks it up); "" on CPU
    devices_per_node: int
    memory_bytes: int                # per device; on CPU, the memory one rank may use
    links: tuple[Link, ...]
    memory_GBps: float | None = None  # device memory bandwidth: the optimizer's update is bound by it
    comm_overlaps_compute: bool = False  # collectives run beside compute (own stream/engine), not on its cores
    sources: tuple[str, ...] = field(default_factory=tuple)
    path: str = ""
    # The file's [achievable_TFLOPS] (per math mode), compute (its compute table: "" where none is known),
    # compute_scale and compute_scale_source, as hardware/README.md describes them.
    achievable_tflops: dict[str, float] = field(default_factory=dict)
    compute: str = ""
    compute_scale: float = 1.0
    compute_scale_source: str = ""

    def link(self, crosses_nodes: bool) -> Link:
        """The level a group uses: the network when it crosses nodes, else the node's own."""
        wanted = "network" if crosses_nodes else "node"
        for link in self.links:
            if link.level == wanted:
                return link
        raise ValueError(f"hardware {self.name}: no [[link]] of level {wanted!r}")


def available() -> list[str]:
    return sorted(p.stem for p in HARDWARE_DIR.glob("*.toml"))


def datasheet_memory_GBps(device_name: str | None) -> float | None:
    """The memory bandwidth the bundled description of the device `device_name` gives (its datasheet's), or None."""
    for name in available():
        hardware = load(name)
        if hardware.device_name == device_name and hardware.memory_GBps:
            return hardware.memory_GBps
    return None


def load(name_or_file: str) -> Hardware:
    """A bundled description by name (hardware/<name>.toml) or a user's own file; ValueError in one line."""
    path = Path(name_or_file) if Path(name_or_file).suffix else HARDWARE_DIR / f"{name_or_file}.toml"
    if not path.is_file():
        raise ValueError(f"--hardware {name_or_file}: no such file or bundled description "
                         f"(bundled: {', '.join(available())})")
    try:
        raw = tomllib.loads(path.read_text())
        links = tuple(Link(level=lk["level"], busbw_GBps=float(lk["busbw_GBps"]),
                           latency_s=float(lk["latency_us"]) * 1e-6, source=lk.get("source", ""))
                      for lk in raw["link"])
        return Hardware(name=raw["name"], description=raw.get("description", ""), device_kind=raw["device_kind"],
                        device_name=raw.get("device_name", ""), devices_per_node=int(raw["devices_per_node"]),
                        memory_bytes=int(float(raw["memory_GiB"]) * 2**30), links=links,
                        memory_GBps=float(raw["memory_GBps"]) if raw.get("memory_GBps") else None,
                        comm_overlaps_compute=bool(raw.get("comm_overlaps_compute", False)),
                        sources=tuple(raw.get("sources", ())), path=str(path),
                        achievable_tflops={k: float(v) for k, v in raw.get("achievable_TFLOPS", {}).items()},
                        compute=raw.get("compute", ""), compute_scale=float(raw.get("compute_scale", 1.0)),
                        compute_scale_source=raw.get("compute_scale_source", ""))
    except (tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"--hardware {path}: {type(exc).__name__}: {exc} (format: {HARDWARE_DIR}/README.md)") \
            from None
