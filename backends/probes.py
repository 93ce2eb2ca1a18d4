"""The device probes bench.compute_table and bench.layer_check measure with, behind one interface: a device, its
name and software, and the probes (GEMM, attention, copy and launch rates; one decoder layer, the head and the
optimizer's step, as torchtitan's eager Llama runs them). torch backs them today (backends/torch_common's
compute_probe and decoder_layer); bench imports this module, never a backend's own.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from types import ModuleType

from common.errors import Unsupported


@dataclass(frozen=True)
class Probes:
    device: object         # the framework's device the probes run on
    kind: str              # "cuda" or "cpu"
    rates: ModuleType      # gemm_tflops, sustained_gemm, attention_tflops, copy_GBps, launch_us
    layers: ModuleType     # time_layer, time_head, time_optimizer

    @property
    def device_name(self) -> str:
        return self.rates.device_name(self.device)

    @property
    def software(self) -> str:
        return self.rates.software()


def load_probes(device: str | None = None) -> Probes:
    """The probes on `device` ("cuda" or "cpu"; default: cuda where torch sees one); Unsupported without torch."""
    if importlib.util.find_spec("torch") is None:
        raise Unsupported("the device probes need torch: pip install 'parbench[torch]'")
    import torch

    from backends.torch_common import compute_probe, decoder_layer

    chosen = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return Probes(chosen, chosen.type, compute_probe, decoder_layer)
