"""torch_dp's reference: a plain torch loop in one process, nn.DataParallel over the CUDA devices (none on CPU).

    python -m backends.torch_dp.bare CONFIG.json RESULT.json
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from backends.torch_common import bare
from backends.torch_common.weights import initialised_model
from backends.torch_dp.worker import replica_devices, start_device
from common.calibration import bare_result, rank_steps
from common.config import RunConfig
from common.initial_weights import run_initial_weights
from common.results import write_json_atomic

IDIOM = "plain torch loop (nn.DataParallel on CUDA), tensors prepared before the clock"


def main(config_path: str, result_path: str) -> None:
    cfg = RunConfig.load(Path(config_path))
    device = start_device(cfg)
    core = initialised_model(cfg.workload, cfg.spec, run_initial_weights(cfg)).to(device)
    ids = replica_devices(cfg)
    model = torch.nn.DataParallel(core, device_ids=ids) if ids else core
    batches = bare.as_tensors(rank_steps(cfg, 0, 1, cfg.devices), device)
    timed = bare.train(model, core.parameters(), batches, cfg, device)
    write_json_atomic(Path(result_path), bare_result([timed], cfg.global_batch, IDIOM))


if __name__ == "__main__":
    main(*sys.argv[1:3])
