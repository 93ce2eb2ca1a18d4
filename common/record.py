"""Assembling the result record of one run from what the harness knows and what the workers measured."""
from __future__ import annotations

from dataclasses import asdict

from common.achievable import mfu_achievable
from common.config import RunConfig
from common.devices import DevicePlan
from common.hostinfo import git_sha, host_info, package_versions, performance_env
from common.peak_flops import PRECISION_MATH, mfu
from common.results import REQUIRED_FIELDS, SCHEMA_VERSION
from common.sections import Fp32Math, TrainableParams
from common.spec import TOKEN_WORKLOADS, training_flops_per_sample


def skeleton(run_id: str, backend: str, workload: str, devices: int, started_at: str, **known) -> dict:
    """Every field present, unknown ones null: the shape of a run that ended before measuring."""
    record = dict.fromkeys(REQUIRED_FIELDS)
    record.update(schema_version=SCHEMA_VERSION, run_id=run_id, backend=backend, workload=workload,
                  devices=devices, started_at=started_at, host=host_info(), versions=package_versions(),
                  git_sha=git_sha(), environment=performance_env(), notes=[], config={}, mfu=None,
                  mfu_achievable=None, memory=None, achievable_peak=None)
    record.update(known)
    return record


def describe_config(cfg: RunConfig, plan: DevicePlan, backend) -> dict:
    """The record fields fixed before the run starts."""
    spec = cfg.spec
    return {
        "strategy": backend.strategy_name(cfg), "framework": backend.framework,
        "framework_version": backend.framework_version(), "device_kind": plan.kind, "virtual": plan.virtual,
        "threads_per_device": plan.threads_per_device, "physical_devices": plan.physical_devices,
        "oversubscribed": plan.oversubscribed,
        "devices_description": plan.description, "scaling": cfg.scaling, "data": cfg.data,
        "per_device_batch": cfg.per_device_batch, "global_batch": cfg.global_batch,
        "warmup_steps": cfg.warmup_steps, "layout": cfg.layout.as_record(spec, cfg.global_batch),
        "params": spec.param_count(),
        "flops_per_sample": training_flops_per_sample(spec), "seed": cfg.seed, "sweep_id": cfg.sweep_id,
        "sweep_command": cfg.sweep_command, "mode": backend.mode_name(cfg),
        "config": {**asdict(cfg), "model": asdict(spec), "optimizer": asdict(cfg.optim)},
        "host": host_info(list(plan.hardware)),
        "notes": backend.notes(cfg, plan),
    }


def measured_fields(cfg: RunConfig, outcome: dict, flops_per_sample: int) -> dict:
    """Throughput and the rest from the loop's outcome; throughput counts every rank's samples."""
    fields = {k: outcome.get(k) for k in ("measured_steps", "step_time_s", "step_times_s", "data_wait_fraction",
                                          "peak_memory_bytes", "loss", "eval")}
    steps, window = outcome["measured_steps"], outcome["measured_time_s"]
    sps = cfg.global_batch * steps / window if steps and window > 0 else None
    fields.update(
        samples_per_s=sps,
        # Every position of a packed sequence is processed, padding of the last row included.
        tokens_per_s=sps * cfg.spec.seq_len if sps and cfg.workload in TOKEN_WORKLOADS else None,
        achieved_flops=sps * flops_per_sample if sps else None,
        eval_history=outcome.get("eval_history"), peak_memory_per_rank=outcome.get("peak_memory_per_rank"),
        total_steps=outcome.get("total_steps"), start_step=outcome.get("start_step"),
        steps_done=outcome.get("steps_done"), stopped_early=outcome.get("stopped_early"),
        train_wall_s=outcome.get("train_wall_s"), backend_metrics=outcome.get("backend_metrics"),
        sample_digests=outcome.get("sample_digests"), memory=outcome.get("memory"),
        achievable_peak=outcome.get("achievable_peak"),
    )
    if outcome.get("breakdown"):  # the workers of some backends replace backend_metrics after the loop
        fields["backend_metrics"] = {**(fields["backend_metrics"] or {}), "breakdown": outcome["breakdown"],
                                     "grad_comm": outcome.get("grad_comm")}
    trainable = TrainableParams.from_metrics(outcome.get("backend_metrics"))
    counted = trainable.count if trainable else None
    if counted is not None:
        # The model as built is what trained; the spec's formula is what it should have been.
        fields["params"] = counted
        if counted != cfg.spec.param_count():
            fields["params_note"] = f"{counted} trainable parameters, the spec's formula gives {cfg.spec.param_count()}"
    return fields


def utilisation(cfg: RunConfig, plan: DevicePlan, record: dict) -> dict:
    """`mfu` (null where no peak is known) and `mfu_basis`: the device model, math mode and peak it rests on.
    A backend whose float32 products run on tensor cores says so in backend_metrics.fp32_math ("tf32").
    `mfu_achievable`: against the peak measured on the run's devices (common.achievable), on a CPU the only MFU."""
    math = PRECISION_MATH[cfg.precision]
    if math == "fp32":
        math = (Fp32Math.from_metrics(record.get("backend_metrics")) or Fp32Math()).mode
    found = mfu(record.get("achieved_flops"), plan.kind, plan.hardware[0] if plan.hardware else None,
                plan.physical_devices, math)
    return {"mfu": found["mfu"], "mfu_basis": found["basis"],
            "mfu_achievable": mfu_achievable(record.get("achieved_flops"), record["devices"],
                                             record.get("achievable_peak"))}


def compile_notes(record: dict) -> list[str]:
    """What a reader of the figures must know about compilation: compile time is kept out of throughput
    only when every compile fell in the warm-up."""
    metrics = record.get("backend_metrics") or {}
    late = metrics.get("recompiled_in_measured_window")
    if not late:
        return []
    return [f"steps {late} (counted from the first step of this run) compiled graphs after the warm-up: they are "
            "left out of the measured steps like the warm-up, their time is in compile_s (a recompile in a long "
            "run, e.g. a new shape, costs that run's wall time all the same)"]
