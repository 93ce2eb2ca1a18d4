"""python -m bench.run --backend B --workload W --devices N [options]: one run, one record.

Exit status (CONVENTIONS §3): 0 ok, 1 failed after starting, 2 bad input (one line, no record),
3 unsupported on this machine (a record says why).

Several hosts: every node runs bench.run with the same --nnodes/--master-addr/--master-port and its
own --node-rank, or, inside a SLURM job step (srun), with none of them: the allocation sets them
(common.scheduler), and a node flag given there must agree with it. Node 0 writes the run's record
(OUT/runs/, aggregated over every rank of every node); the other nodes write the same record tagged
with their node rank to OUT/node-records/, so that summaries and reports count the run once.
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

from backends import BACKEND_ONLY, BACKENDS, EXECUTED_BY, load_backend
from bench.cli import (
    RUN_OPTIONS,
    OneLineParser,
    add_run_options,
    backend_names,
    check_model_size,
    non_negative_int,
    port_number,
    positive_int,
    relative_size,
    workload_names,
)
from bench.fit import fit_before_launch
from common.calibration import BARE_RESULTS, check_bare
from common.config import RunConfig, per_device_batch_for
from common.data.batches import TrainBatches
from common.data.datasets import TRAIN_SPLIT, load_split, resolve_data_mode
from common.data.files import resolve_data_dir
from common.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, EXIT_UNSUPPORTED, BadInput, Cancelled, Unsupported
from common.hostinfo import load_over, machine_load
from common.launch import RunFailed, cancel_on_signals
from common.layout import OPTIONS as LAYOUT_OPTIONS
from common.layout import Layout, refuse_layout
from common.nodes import check_node_options, describe_nodes
from common.profile import PROFILES
from common.record import compile_notes, describe_config, measured_fields, skeleton, utilisation
from common.results import NODE_RECORDS, RUN_RECORDS, new_run_id, utc_now, write_json_atomic, write_record
from common.scheduler import slurm_step
from common.sections import FitCheck
from common.spec import DEFAULTS, model_spec
from common.tensorboard import check_available as check_tensorboard


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="bench.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", required=True, choices=backend_names())
    p.add_argument("--workload", required=True, choices=workload_names())
    p.add_argument("--devices", type=positive_int,
                   help="devices on this node, one process each: CUDA devices when present, else virtual CPU "
                        "devices; the run's world is --nnodes x this (needed, except in a SLURM job step that "
                        "gave the task GPUs: then those)")
    # Set by bench.compare, which must know the record's name before the run starts.
    p.add_argument("--sweep-id", default="", help=argparse.SUPPRESS)
    p.add_argument("--sweep-command", default="", help=argparse.SUPPRESS)  # the sweep's, for its record
    p.add_argument("--run-id", default="", help=argparse.SUPPRESS)
    # Set by bench.calibrate: the framework's bare loop instead of the suite's, result in OUT/bare/RUN_ID.json.
    p.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    add_run_options(p)
    n = p.add_argument_group("several hosts (torch_ddp, torch_3d, tf_mirrored --tf-mode multi_worker, keras_jax "
                             "--jax-mode multi_process, mindspore_auto); in a SLURM job step the allocation sets them")
    n.add_argument("--nnodes", type=positive_int, default=1, action=Given,
                   help="hosts taking part; each runs bench.run")
    n.add_argument("--node-rank", type=non_negative_int, default=0, action=Given,
                   help="this host's rank; node 0 hosts the rendezvous and writes the run's record")
    n.add_argument("--master-addr", help="node 0's IPv4 address, the same on every node (needed with --nnodes > 1)")
    n.add_argument("--master-port", type=port_number, help="node 0's rendezvous port, the same on every node "
                   "(needed with --nnodes > 1; one node: this loopback port if given, else a free one; under "
                   "SLURM: one derived from the job and step ids)")
    s = p.add_argument_group("sensitivity probe (bench.parity)")
    s.add_argument("--init-perturbation", type=relative_size, default=0.0, metavar="REL",
                   help="scale every initial trainable weight by (1 + REL x N(0, 1)), e.g. 1e-6; default 0")
    s.add_argument("--init-perturbation-seed", type=positive_int, default=1, metavar="K",
                   help="which draw of that noise (default 1)")
    return p


class Given(argparse.Action):
    """Stores the value and notes that the flag was typed: inside an allocation a typed node flag is held
    against it, while a default one is taken from it."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.given = {*getattr(namespace, "given", ()), self.dest}


def resolve_nodes(args, env: Mapping[str, str] = os.environ) -> None:
    """The node options and devices per node, from the SLURM job step bench.run runs in (common.scheduler) or
    from the flags; sets args.scheduler (the record's section, None outside a scheduler) and
    args.scheduler_tag (for the run's name, the same on every node). Bad input: a flag
    that contradicts the allocation, an allocation bench.run cannot span, a node layout that cannot meet."""
    step = slurm_step(env)
    args.scheduler = step.record() if step else None
    args.scheduler_tag = step.run_tag() if step else ""
    if step:
        given = getattr(args, "given", set())
        world = step.world(nnodes=args.nnodes if "nnodes" in given else None,
                           node_rank=args.node_rank if "node_rank" in given else None,
                           master_addr=args.master_addr, master_port=args.master_port, devices=args.devices)
        args.nnodes, args.node_rank, args.devices = world.nnodes, world.node_rank, world.devices
        args.master_addr, args.master_port = world.master_addr, world.master_port
    elif args.devices is None:
        raise BadInput("the following arguments are required: --devices")
    check_node_options(args.nnodes, args.node_rank, args.master_addr, args.master_port)


def check_options(args) -> None:
    """Combinations argparse cannot see."""
    if args.steps and args.epochs:
        raise BadInput("give --steps or --epochs, not both")
    if args.patience and not args.eval_every:
        raise BadInput("--patience needs --eval-every")
    if args.skip_eval and args.eval_every:
        raise BadInput("--skip-eval contradicts --eval-every")
    if args.skip_eval and args.eval_samples:
        raise BadInput("--skip-eval contradicts --eval-samples")
    if args.profile_dir and not args.profile:
        raise BadInput("--profile-dir needs --profile")
    if args.resume and not (args.checkpoint_dir or args.checkpoint_every):
        raise BadInput("--resume needs --checkpoint-dir or --checkpoint-every")
    check_backend_options(args)
    check_model_size(args.workload, args.model_size)
    if args.max_restarts and not args.checkpoint_every:
        raise BadInput("--max-restarts needs --checkpoint-every: a restart resumes from the newest checkpoint")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {out}: exists and is not a directory")
    probe = out if out.exists() else next((p for p in out.parents if p.exists()), Path("."))
    if not os.access(probe, os.W_OK):
        raise BadInput(f"--out {out}: not writable")


def check_backend_options(args) -> None:
    """An option of one backend (the registry's declaration) given to another is bad input, by name."""
    takes = BACKENDS[args.backend].options
    for option in RUN_OPTIONS:
        if option.dest in BACKEND_ONLY and option.dest not in takes \
                and getattr(args, option.dest) != option.kwargs.get("default"):
            owners = [name for name, entry in BACKENDS.items() if option.dest in entry.options]
            raise BadInput(f"{option.flags[0]}: an option of {', '.join(owners)}, not of {args.backend}")


def check_supported(name: str, backend, cfg: RunConfig, plan) -> None:
    """Unsupported (or BadInput) for a run the backend will not do: what the layout asks that it does not execute
    first (its registry entry, by flag), then the backend's own check."""
    entry = BACKENDS[name]
    refuse_layout(cfg.layout, name, entry.layouts, EXECUTED_BY, dict(entry.refusals))
    backend.check(cfg, plan)


def scaling_of(args) -> str:
    return args.scaling or ("strong" if args.epochs else "weak")


def world_size(args) -> int:
    return args.nnodes * args.devices


@dataclass(frozen=True)
class Checked:
    """What check_run established, for build_config: the run is checked once."""
    layout: Layout
    per_device_batch: int
    data_dir: Path
    data: str
    fit: FitCheck | None   # memory per device predicted before launch (bench.fit); None: not asked


def check_run(args, fit: bool = True) -> Checked:
    """Every check of a run that needs no framework and no data loaded: bench.compare calls it for each
    run it plans, before the sweep starts. The parallel layout is validated here, once, for every backend.
    `fit`: also predict its memory per device and refuse it where it does not fit (bench.plan asks without:
    it holds every layout against a limit of its own)."""
    check_options(args)
    defaults = DEFAULTS[args.workload]
    layout = Layout.for_devices(world_size(args), **{o.field: getattr(args, o.field) for o in LAYOUT_OPTIONS})
    per_device = per_device_batch_for(scaling_of(args), args.batch_size or defaults.per_device_batch,
                                      layout.data, layout.accumulation(args.grad_accum))
    global_batch = per_device * layout.data * layout.accumulation(args.grad_accum)
    layout.validate(model_spec(args.workload, args.model_size), global_batch, args.grad_accum)
    data_dir = resolve_data_dir(args.data_dir)
    data = resolve_data_mode(args.data, args.workload, data_dir)
    if not args.epochs:
        check_warmup(args, args.steps or defaults.default_steps)
    # Accumulated micro-batches hold one micro-batch's activations at a time, as a pipeline's stage does.
    check = fit_before_launch(args, replace(layout, micro_batches=layout.accumulation(args.grad_accum)),
                              global_batch, args.devices) if fit else None
    return Checked(layout, per_device, data_dir, data, check)


def check_warmup(args, total: int) -> int:
    warmup = DEFAULTS[args.workload].default_warmup_steps if args.warmup_steps is None else args.warmup_steps
    if warmup >= total:
        raise BadInput(f"--warmup-steps {warmup} leaves none of the {total} steps to measure")
    return warmup


def build_config(args, run_id: str, plan, checked: Checked | None = None) -> RunConfig:
    checked = checked or check_run(args)
    defaults = DEFAULTS[args.workload]
    batch_size = args.batch_size or defaults.per_device_batch
    world = world_size(args)
    layout, per_device = checked.layout, checked.per_device_batch
    spec = model_spec(args.workload, args.model_size)
    # Loading the train split here validates the files before any worker starts, and gives
    # the epoch length that --epochs needs.
    train = TrainBatches(load_split(args.workload, TRAIN_SPLIT, checked.data, checked.data_dir, spec, args.seed),
                         spec, args.seed, per_device, layout.data, 0, layout.accumulation(args.grad_accum))
    total = math.ceil(args.epochs * train.steps_per_epoch) if args.epochs else (args.steps or defaults.default_steps)
    warmup = check_warmup(args, total)
    key = f"{args.backend}-{args.workload}-n{world}-seed{args.seed}"
    if args.init_perturbation:  # other initial weights: never resume an unperturbed run's checkpoints
        key += f"-perturbed{args.init_perturbation:g}x{args.init_perturbation_seed}"
    if args.max_restarts and not args.resume:
        key = run_id  # a restarted worker must resume this run's checkpoints, never an earlier run's
    # A stable key lets a rerun --resume; within a sweep the sweep id keeps two sweeps sharing --out apart.
    ckpt_dir = args.checkpoint_dir or (str(Path(args.out) / "checkpoints" / args.sweep_id / key)
                                       if args.checkpoint_every or args.resume else "")
    return RunConfig(
        run_id=run_id, backend=args.backend, workload=args.workload, devices=world,
        device_kind=plan.kind, threads_per_device=plan.threads_per_device, scaling=scaling_of(args),
        batch_size=batch_size, per_device_batch=per_device, grad_accum=args.grad_accum, data=checked.data,
        data_dir=str(checked.data_dir), seed=args.seed, total_steps=total, warmup_steps=warmup, out=args.out,
        model_size=args.model_size, precision=args.precision, sync_bn=args.sync_bn, virtual=plan.virtual,
        compile=args.compile or "",
        eval_every=args.eval_every, skip_eval=args.skip_eval, eval_samples=args.eval_samples, patience=args.patience,
        checkpoint_every=args.checkpoint_every,
        checkpoint_dir=ckpt_dir, resume=args.resume, max_restarts=args.max_restarts, timeout_s=args.timeout,
        collective_timeout_s=args.collective_timeout, sweep_id=args.sweep_id,
        sweep_command=args.sweep_command, layout=layout,
        backend_options=backend_options(args), nnodes=args.nnodes, node_rank=args.node_rank,
        master_addr=args.master_addr or "", master_port=args.master_port or 0,
        init_perturbation=args.init_perturbation, init_perturbation_seed=args.init_perturbation_seed,
        breakdown_steps=args.breakdown_steps,
        tensorboard_dir=str(Path(args.tensorboard).resolve()) if args.tensorboard else "",
        profile_steps=args.profile,
        profile_dir=str(Path(args.profile_dir or Path(args.out) / PROFILES).resolve()) if args.profile else "",
    )


def backend_options(args) -> dict:
    """The options only this run's backend takes, for its workers (RunConfig.backend_options); those
    RunConfig has a field of its own for (--max-restarts) stay there."""
    own_fields = {f.name for f in fields(RunConfig)}
    return {o: getattr(args, o) for o in BACKENDS[args.backend].options
            if o not in own_fields and getattr(args, o) is not None}


def _finish(record: dict, out: str, status: str, error: str | None, t0: float) -> Path:
    record.update(status=status, error=error, duration_s=round(time.monotonic() - t0, 3))
    folder = RUN_RECORDS if record.get("node_rank", 0) == 0 else NODE_RECORDS
    return write_record(record, Path(out), folder)


def run_bare(backend, cfg: RunConfig, plan, workdir: Path) -> int:
    """bench.calibrate's other half: the framework's own idiom on the same config; no run record."""
    try:
        check_bare(cfg)
        result = backend.run_bare(cfg, plan, workdir)
    except Unsupported as exc:
        print(f"unsupported: {exc}", file=sys.stderr)
        return EXIT_UNSUPPORTED
    except RunFailed as exc:
        print(f"failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    path = write_json_atomic(Path(cfg.out) / BARE_RESULTS / f"{cfg.run_id}.json", result)
    print(f"ok: bare {result['samples_per_s'] or 0:.1f} samples/s ({result['idiom']}), result {path}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    # Ctrl-C, a sweep's cancel or timeout, a scheduler's SIGTERM: Cancelled unwinds through
    # run_supervised, which takes the launcher's process group down with it.
    cancel_on_signals()
    args = build_parser().parse_args(argv)
    try:
        resolve_nodes(args)  # before check_run: the world it checks is the allocation's
    except BadInput as exc:
        print(f"bench.run: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    run_id = args.run_id or new_run_id(args.backend, args.workload, world_size(args), args.scheduler_tag)
    workdir = Path(args.out) / "logs" / run_id
    if args.nnodes > 1:  # under SLURM every node shares --out (one filesystem): each keeps its config and logs apart
        workdir /= f"node{args.node_rank}"
    try:
        return run(args, run_id, workdir)
    except Cancelled as exc:
        written = [p for folder in (RUN_RECORDS, NODE_RECORDS)
                   if (p := Path(args.out) / folder / f"{run_id}.json").is_file()]
        if written:  # it had finished when the signal came
            print(f"bench.run: {exc.name} after run {run_id} finished; its record {written[0]} is kept",
                  file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
            print(f"bench.run: cancelled by {exc.name}: run {run_id} and its workers stopped; no record written, "
                  f"its logs removed", file=sys.stderr)
        return exc.exit_code


def run(args, run_id: str, workdir: Path) -> int:
    t0, started = time.monotonic(), utc_now()
    world = world_size(args)
    record = skeleton(run_id, args.backend, args.workload, world, started, scaling=scaling_of(args),
                      seed=args.seed, sweep_id=args.sweep_id, sweep_command=args.sweep_command, data=args.data,
                      scheduler=args.scheduler,
                      **describe_nodes(args.nnodes, args.node_rank, args.devices, args.master_addr,
                                       args.master_port))
    try:
        checked = check_run(args)  # before the framework loads: a bad-input line is not buried in its warnings
        backend = load_backend(args.backend)
        record.update(strategy=backend.strategy, framework=backend.framework,
                      framework_version=backend.framework_version())
        plan = backend.plan_devices(args.devices, args.device_kind, args.threads_per_device or 1)
        cfg = build_config(args, run_id, plan, checked)
        record.update(describe_config(cfg, plan, backend))
        if checked.fit:
            record.update(checked.fit.to_record())
        if cfg.multi_node and not backend.spans_hosts(cfg):
            raise BadInput(f"--nnodes {cfg.nnodes}: {backend.strategy_name(cfg)} runs on one host; several hosts "
                           "need torch_ddp, torch_3d, tf_mirrored --tf-mode multi_worker, keras_jax --jax-mode "
                           "multi_process or mindspore_auto")
        check_supported(args.backend, backend, cfg, plan)
        if cfg.tensorboard_dir:
            check_tensorboard()
    except BadInput as exc:
        print(f"bench.run: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Unsupported as exc:
        if args.bare:  # a calibration's bare half writes no run record; the suite's half records the refusal
            print(f"unsupported: {exc}", file=sys.stderr)
            return EXIT_UNSUPPORTED
        path = _finish(record, args.out, "unsupported", str(exc), t0)
        print(f"unsupported: {exc} (record {path})", file=sys.stderr)
        return EXIT_UNSUPPORTED

    workdir.mkdir(parents=True, exist_ok=True)
    if args.bare:
        return run_bare(backend, cfg, plan, workdir)
    print(f"{run_id}: {backend.strategy_name(cfg)} on {plan.description}, {cfg.data} data, "
          f"{cfg.total_steps} steps of global batch {cfg.global_batch}; progress in {workdir}", file=sys.stderr)
    load_before = machine_load()
    try:
        outcome = backend.run(cfg, plan, workdir)
        record["load"] = load_over(load_before, machine_load())
        record.update(measured_fields(cfg, outcome, record["flops_per_sample"]))
        record.update(utilisation(cfg, plan, record))
        record["notes"] += compile_notes(record)
        record["notes"] += backend.measured_notes(record)
        if outcome.get("hosts"):
            record["nodes"]["hosts"] = outcome["hosts"]
    except Unsupported as exc:  # found out only by trying, e.g. DataParallel over a repeated GPU
        path = _finish(record, args.out, "unsupported", str(exc), t0)
        print(f"unsupported: {exc} (record {path})", file=sys.stderr)
        return EXIT_UNSUPPORTED
    except RunFailed as exc:
        path = _finish(record, args.out, "failed", str(exc), t0)
        print(f"failed: {exc} (record {path})", file=sys.stderr)
        return EXIT_FAILED
    except Exception as exc:  # a harness bug must still leave a record, with the trace for a report
        (workdir / "harness-traceback.txt").write_text(traceback.format_exc())
        path = _finish(record, args.out, "failed", f"{type(exc).__name__}: {exc}", t0)
        print(f"failed: {type(exc).__name__}: {exc} (record {path})", file=sys.stderr)
        return EXIT_FAILED
    path = _finish(record, args.out, "ok", None, t0)
    ev = record["eval"]
    part = (f"; its first {ev['samples_evaluated']} of {ev['split_size']} samples"
            if ev and ev.get("samples_evaluated", 0) < ev.get("split_size", 0) else "")
    metric = f", {ev['metric']} {ev['value']:.4f} on {ev['split']} ({ev['count']}{part})" if ev else ""
    print(f"ok: {record['samples_per_s'] or 0:.1f} samples/s{metric}, record {path}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
