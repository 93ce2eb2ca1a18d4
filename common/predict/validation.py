"""Predicted against measured: every ok multi-device run of a results folder predicted from the folder's 1-device
runs and link probes only, never from its own timings. docs/prediction.md, "Validation"."""
from __future__ import annotations

import statistics
from dataclasses import asdict, replace

from common.config_key import config_key, record_layout, sweep_of
from common.layout import Layout
from common.predict.basis import (
    Basis,
    accumulation,
    background_load,
    eval_batch,
    from_records,
    measured_memory,
    per_process,
    stage_split,
)
from common.predict.collectives import KINDS, Collective, per_kind
from common.predict.hardware import Hardware
from common.predict.prediction import Prediction
from common.predict.step import predict
from common.sections import Bubble, CommPerStep, GradComm, StateBytesPerRank
from common.spec import model_spec

# Backends whose collectives a compiler places: predicted with those its compiled step holds (comm_per_step).
COMPILER_PLACED = ("keras_jax",)


def _size(record: dict) -> str:
    return (record.get("config") or {}).get("model_size") or "tiny"


def _key(record: dict) -> tuple:
    return (*(record.get(k) for k in ("backend", "workload", "device_kind", "threads_per_device")), _size(record),
            (record.get("host") or {}).get("name"), (record.get("config") or {}).get("precision"))


def execution(record: dict) -> tuple[bool, str]:
    """How a run executes the model beyond its layout: --recompute and --compile change the compute."""
    return bool((record.get("layout") or {}).get("recompute")), (record.get("config") or {}).get("compile") or ""


def median_repeat(candidates: list[dict]) -> dict:
    """Of runs latest first, the median by step time of those in the first one's sweep (its repeats); of two, the
    faster: a repeat slowed by the machine is the likelier outlier."""
    repeats = sorted((r for r in candidates if sweep_of(r) == sweep_of(candidates[0])),
                     key=lambda r: r["step_time_s"]["p50"])
    return repeats[(len(repeats) - 1) // 2]


def _one_device_alike(run: dict, records: list[dict]) -> list[dict]:
    """The ok 1-device runs that measured a step, of the run's backend, workload, size, host and precision."""
    return [r for r in records if r["status"] == "ok" and r["devices"] == 1 and _key(r) == _key(run)
            and (r.get("step_time_s") or {}).get("p50")]


def repeats_of(reference: dict, records: list[dict]) -> list[dict]:
    """The ok repeats of a 1-device reference in its sweep, itself among them."""
    return [r for r in _one_device_alike(reference, records) if sweep_of(r) == sweep_of(reference)
            and r["global_batch"] == reference["global_batch"] and accumulation(r) == accumulation(reference)
            and execution(r) == execution(reference)]


def basis_of(spec, refs: list[dict], records: list[dict]) -> Basis:
    """The basis of `refs` (references()), with the co-run probes of whichever repeats of the main one carry them:
    a sweep probes its first 1-device run in each repeat, and the median repeat need not be one of those."""
    return from_records(spec, refs, co_run_from=repeats_of(refs[0], records))


def references(run: dict, records: list[dict]) -> list[dict]:
    """The 1-device runs a run is predicted from, the main one first (executed alike, --recompute and --compile,
    first; then same global batch and micro-batches, else same global batch, else any; of each the latest sweep's
    median repeat). The others: that global batch at other micro-batch counts, executed as the main one."""
    ones = sorted(_one_device_alike(run, records), key=lambda r: r.get("started_at") or "", reverse=True)

    def rank(r):
        same_batch = r["global_batch"] == run["global_batch"]
        return (execution(r) != execution(run), not (same_batch and accumulation(r) == accumulation(run)),
                not same_batch, r.get("sweep_id") != run.get("sweep_id"))
    ones.sort(key=rank)
    if not ones:
        return []
    main = median_repeat([r for r in ones if rank(r) == rank(ones[0])])
    others = [r for r in ones if r["global_batch"] == main["global_batch"] and execution(r) == execution(main)]
    counts = dict.fromkeys(accumulation(r) for r in others if accumulation(r) != accumulation(main))
    return [main, *(median_repeat([r for r in others if accumulation(r) == k]) for k in counts)]


def probed_links(records: list[dict]) -> dict[int, dict[str, float]]:
    """Rank count -> the median bus bandwidth (GB/s) of the folder's link probes at that count: `all_reduce`, and
    each kind the probes timed apart (grad_comm.link_GBps_by_kind: Gloo runs them as no ring)."""
    found: dict[int, dict[str, list[float]]] = {}
    for r in records:
        comm = GradComm.from_metrics(r.get("backend_metrics")) if r["status"] == "ok" else None
        if comm and comm.link_GBps and comm.ranks > 1:
            for kind, gbps in {"all_reduce": comm.link_GBps, **(comm.link_GBps_by_kind or {})}.items():
                found.setdefault(comm.ranks, {}).setdefault(kind, []).append(gbps)
    return {n: {kind: statistics.median(v) for kind, v in kinds.items()} for n, kinds in found.items()}


def hardware_for(run: dict, hardware: Hardware, links: dict[int, dict[str, float]]) -> tuple[Hardware, str]:
    """The hardware description with its node link's bandwidth replaced by the folder's probes (probed_links)."""
    if not links:
        return hardware, f"link: {hardware.name}'s description (no link probe in the folder)"
    n = min(links, key=lambda k: (abs(k - run["devices"]), k))
    busbw, by_kind = links[n]["all_reduce"], {k: v for k, v in links[n].items() if k != "all_reduce"}
    probed = tuple(replace(lk, busbw_GBps=busbw, busbw_by_kind=by_kind, source=f"median link probe at {n} ranks")
                   if lk.level == "node" else lk for lk in hardware.links)
    apart = "".join(f", {kind} {gbps:.3g}" for kind, gbps in sorted(by_kind.items()))
    return replace(hardware, links=probed), f"link: probe at {n} ranks, {busbw:.3g} GB/s busbw{apart}"


def compiled_collectives(run: dict, layout: Layout) -> list[Collective] | None:
    """A compiler-placed backend's collectives as its step was compiled (rank 0's comm_per_step), or None."""
    comm = CommPerStep.from_metrics(run.get("backend_metrics"))
    if run["backend"] not in COMPILER_PLACED or not comm or not comm.ranks or comm.ranks[0] is None:
        return None
    return [Collective(kind, "all", c.bytes / c.calls, c.calls, layout.devices, True, "as compiled")
            for kind, c in comm.ranks[0].items() if kind in KINDS and c.calls]


def relative(predicted: float | None, measured: float | None) -> float | None:
    return None if predicted is None or not measured else (predicted - measured) / measured


def _memory(measured: list, devices: int, predicted: list[float] | None, model: list[float],
            overhead: float | None) -> dict:
    """Predicted memory per rank against measured, per process where one process drives several devices."""
    if measured and predicted and len(measured) < devices:
        predicted = per_process(model, len(measured), overhead)
    errors = [e for p, m in zip(predicted or [], measured) if (e := relative(p, m)) is not None]
    return {"predicted": predicted, "measured": measured, "error": max(errors, key=abs, default=None)}


def compare(run: dict, prediction: Prediction, refs: list[dict], link_note: str) -> dict:
    measured_step = run["step_time_s"]["p50"]
    peaks = [v for v in measured_memory(run, "process_peak_per_rank") if v is not None]
    training = measured_memory(run, "training_per_rank") if (run.get("memory") or {}).get("training_per_rank") \
        else None
    state = StateBytesPerRank.from_metrics(run.get("backend_metrics"))
    predicted_state = [asdict(s) for s in prediction.state_per_rank]
    measured_state = [asdict(s) for s in state.ranks] if state else None
    bubble = Bubble.from_metrics(run.get("backend_metrics"))
    return {
        "run_id": run["run_id"], "backend": run["backend"], "layout": _layout(run).name, "devices": run["devices"],
        "oversubscribed": bool(run.get("oversubscribed")), "global_batch": run["global_batch"],
        "references": [r["run_id"] for r in refs], "link": link_note,
        "step_s": {"predicted": prediction.step_s, "measured": measured_step,
                   "error": relative(prediction.step_s, measured_step)},
        "step_parts_s": prediction.parts_s,
        "memory_per_rank": {**_memory(peaks, run["devices"], prediction.memory_per_rank, prediction.model_per_rank,
                                      prediction.memory_overhead), "what": "process peak (RSS on CPU)"},
        "training_memory_per_rank": _memory(training, run["devices"], prediction.training_per_rank,
                                            prediction.training_model_per_rank, prediction.training_overhead)
        if training else None,
        "state_bytes_per_rank": {"predicted": predicted_state, "measured": measured_state,
                                 "exact": predicted_state == measured_state if state else None},
        "idle_per_stage": {"predicted": prediction.idle_per_stage,
                           "measured": bubble.measured_per_stage if bubble else None,
                           "analytic": bubble.analytic if bubble else None} if prediction.idle_per_stage else None,
        "comm_per_step": _comm_check(run, prediction),
        "notes": prediction.notes,
    }


def _comm_check(run: dict, prediction: Prediction) -> dict | None:
    """Per kind, the bytes and calls per step the formulas give for rank 0's stage against what rank 0 counted
    (torch_3d's comm_per_step); None when the run counted none."""
    comm = CommPerStep.from_metrics(run.get("backend_metrics"))
    if not comm or not comm.ranks or comm.ranks[0] is None:
        return None
    counted = comm.ranks[0]
    predicted = per_kind(prediction.collectives_of_rank0)
    kinds = sorted(set(predicted) | set(counted))
    return {k: {"predicted": predicted.get(k), "measured": ({"bytes": counted[k].bytes, "calls": counted[k].calls}
                                                            if k in counted else None)} for k in kinds}


def _layout(run: dict) -> Layout:
    """The run's layout; a record without one ran plain data parallel."""
    return record_layout(run) if run.get("layout") else Layout(dp=run["devices"])


def run_layout(run: dict) -> Layout:
    """The layout a run is predicted in: accumulated micro-batches run like a pipeline's, one after the other on
    every rank, and a pipeline's layers are placed as the run placed them, whatever auto would pick today."""
    layout = replace(_layout(run), micro_batches=accumulation(run))
    placed = stage_split(run)
    return replace(layout, stage_split=",".join(map(str, placed))) if placed else layout


def _errors(rows: list[dict], part: str, key: str = "error") -> dict:
    absolute = [abs(e) for r in rows if (e := (r.get(part) or {}).get(key)) is not None]
    return {"runs": len(absolute), "median_abs_error": statistics.median(absolute) if absolute else None,
            "max_abs_error": max(absolute, default=None)}


def configurations(rows: list[dict], records: list[dict]) -> list[dict]:
    """Each configuration's repeats (same sweep, configuration key and devices) as one: median against median."""
    by_id = {r["run_id"]: r for r in records}
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        run = by_id[row["run_id"]]
        groups.setdefault((sweep_of(run), config_key(run).id, run["devices"]), []).append(row)
    found = []
    for (sweep, key, devices), alike in groups.items():
        predicted = statistics.median(r["step_s"]["predicted"] for r in alike)
        measured = [r["step_s"]["measured"] for r in alike]
        median = statistics.median(measured)
        found.append({"sweep_id": sweep, "config_key": key, "backend": alike[0]["backend"],
                      "layout": alike[0]["layout"], "devices": devices,
                      "oversubscribed": any(r["oversubscribed"] for r in alike), "runs": [r["run_id"] for r in alike],
                      "step_s": {"predicted": predicted, "measured": median, "error": relative(predicted, median),
                                 "measured_range": [min(measured), max(measured)]}})
    return found


def validate(records: list[dict], hardware: Hardware, account_load: bool = True) -> dict:
    """validation.json's content. `account_load`: CPU runs' contention includes the other programs' load each record
    measured; each run also carries the prediction without it (step_s.error_ignoring_load)."""
    links = probed_links(records)
    runs, skipped = [], []
    for run in sorted(records, key=lambda r: (r["backend"], r["devices"], r.get("started_at") or "")):
        if run["status"] != "ok" or run["devices"] < 2 or not (run.get("step_time_s") or {}).get("p50"):
            continue
        refs = references(run, records)
        if not refs:
            skipped.append({"run_id": run["run_id"], "why": "no ok 1-device run of its backend, workload, size, "
                                                             "host and threads per device"})
            continue
        spec = model_spec(run["workload"], _size(run))
        layout = run_layout(run)
        try:
            target, link_note = hardware_for(run, hardware, links)
            basis = basis_of(spec, refs, records)
            counted = compiled_collectives(run, layout)
            loads = (background_load(run) if account_load else None, None)  # as accounted, and ignoring the load
            prediction, plain = (predict(spec, layout, run["global_batch"], target, basis, run["backend"], load,
                                         eval_batch(run), counted) for load in loads)
        except ValueError as exc:
            skipped.append({"run_id": run["run_id"], "why": str(exc)})
            continue
        row = compare(run, prediction, refs, link_note)
        if counted is not None:  # taken from the record: nothing to hold against it
            row["notes"].append("collectives as XLA compiled them (the run's comm_per_step), not predicted")
            row["comm_per_step"] = None
        row["step_s"]["error_ignoring_load"] = relative(plain.step_s, row["step_s"]["measured"])
        row["load"] = {"background_run": background_load(run), "background_reference": basis.background,
                       "accounted": account_load}
        row["basis_guesses"] = list(basis.guesses)
        runs.append(row)

    def summary(rows: list[dict]) -> dict:
        return {"step_s": _errors(rows, "step_s"),
                "step_s_ignoring_load": _errors(rows, "step_s", "error_ignoring_load"),
                "memory_per_rank": _errors(rows, "memory_per_rank"),
                "training_memory_per_rank": _errors(rows, "training_memory_per_rank"),
                "resting_on_a_guess": sum(1 for r in rows if r["basis_guesses"]),
                "state_bytes_exact": sum(1 for r in rows if r["state_bytes_per_rank"]["exact"]),
                "state_bytes_compared": sum(1 for r in rows if r["state_bytes_per_rank"]["exact"] is not None)}

    def of_configs(rows: list[dict]) -> dict:
        return {"step_s": _errors(rows, "step_s"), "most_repeats": max((len(r["runs"]) for r in rows), default=0)}
    quiet = [r for r in runs if not r["oversubscribed"]]
    configs = configurations(runs, records)
    return {"hardware": hardware.name,
            "links_probed_GBps": {str(k): v["all_reduce"] for k, v in sorted(links.items())},
            "runs": runs, "configurations": configs, "skipped": skipped,
            "summary": {"all": summary(runs), "not_oversubscribed": summary(quiet),
                        "configurations": {"all": of_configs(configs), "not_oversubscribed": of_configs(
                            [c for c in configs if not c["oversubscribed"]])},
                        "oversubscribed_runs": len(runs) - len(quiet), "skipped_runs": len(skipped)}}
