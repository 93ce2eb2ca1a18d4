"""bench.compare --co-run-probe: a 1-device run's command again as K processes at once on its CPU host; how much
they slow each other goes into its record (common.sections.CoRun). docs/prediction.md, "Contention on a CPU host"."""
from __future__ import annotations

import json
import statistics
import subprocess
from collections.abc import Callable
from pathlib import Path

from common.errors import Cancelled
from common.launch import child_env
from common.results import load_records, write_json_atomic
from common.sections import CoRun

FOLDER = "co-run"


def processes(cores: int | None, threads_per_device: int | None, largest_devices: int) -> int:
    """How many copies run side by side: the sweep's largest device count, as many as the cores hold; 0 when
    fewer than two fit (nothing to measure)."""
    k = min((cores or 1) // max(threads_per_device or 1, 1), largest_devices)
    return k if k >= 2 else 0


def probe(reference: dict, k: int, command: Callable[[Path], list[str]], out: Path, timeout_s: float,
          stop: Callable[..., None]) -> CoRun | None:
    """Run `command(folder)` (the reference's bench.run, its --out set to folder) k times at once under
    out/co-run/<reference>/; every copy is waited for (at most timeout_s) and reaped. None, with the reason
    printed, when a copy left no ok record."""
    base = out / FOLDER / reference["run_id"]
    folders = [base / str(i) for i in range(k)]
    procs = []
    try:
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / "bench.run.log", "wb") as log:  # the child holds its own copy of the file
                procs.append(subprocess.Popen(command(folder), env=child_env({}), stdout=log,
                                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                              start_new_session=True))
        for proc in procs:
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                stop(proc)
    except Cancelled as exc:
        for proc in procs:
            stop(proc, exc.signum)
        raise
    records = [next((r for r in load_records(folder) if r.get("status") == "ok"), None) for folder in folders]
    if any(r is None for r in records):
        print(f"co-run probe of {reference['run_id']}: a copy left no ok record (logs in {base}); "
              "side by side not measured", flush=True)
        return None
    medians = [r["step_time_s"]["p50"] for r in records]
    return CoRun(processes=k, step_s_p50=medians, slowdown=statistics.median(medians) / reference["step_time_s"]["p50"],
                 run_ids=[r["run_id"] for r in records])


def attach(record_path: Path, section: CoRun) -> None:
    """The reference's record with the probe's section added (the rest as bench.run wrote it)."""
    write_json_atomic(record_path, {**json.loads(record_path.read_text()), **section.to_record()})
