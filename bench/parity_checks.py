"""The checks of bench.parity, as pure functions of run records: do the backends run the same experiment?

Every backend runs the same global batch of 2b samples twice: on 1 device as 2 accumulated
micro-batches of b, and on 2 devices with b each. Those are exactly the same computation (the
CNN's BatchNorm normalises each micro-batch, or each rank's slice, on its own), so one 1-device
run per backend serves both the cross-framework checks and the 2-devices-vs-1 check.

A check is `pass`, `fail` or `skip` (with the reason: a backend or device count that is
`unsupported` here is never counted as passed, and never as failed).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from common.final_params import FIELD as FINAL_PARAMS
from common.final_params import compared as weight_compared
from common.final_params import deviation as weight_deviation

# Step 0 is a forward pass from identical weights on identical inputs: only the order of float32
# sums inside each framework's kernels differs (measured: <= 5.3e-7 relative, both workloads).
STEP0_RTOL = 1e-4

# After step 0 the loss depends on every earlier update, and how far float32 differences carry it
# depends on the workload and its data, so the tolerance is measured, not assumed. bench.parity
# runs the reference backend (the first one that ran) again with its initial weights scaled by
# (1 + PROBE_PERTURBATION x N(0, 1)), once per PROBE_SEEDS, and takes the largest relative deviation
# of those curves from the reference's by each step: the reference's own sensitivity. A backend's
# curve (and each 2-device curve from its 1-device one) may deviate from the reference's by
# SENSITIVITY_FACTOR times that, and never less than ROUNDING_RTOL.
#
# Why, measured on the CNN (per-device batch 4, 20 steps; docs/parity.md has the figures):
# - Kernels: on the same weights and inputs the frameworks' forward passes differ by about 1e-7
#   relative per conv, but Keras' BatchNormalization is 1.8e-5 off a float64 reference on outputs
#   of scale 6 (3e-6 relative; torch's: 5e-7). PROBE_PERTURBATION is that size.
# - Discrete flips: a pre-activation within that error of zero lands on the other side of a ReLU
#   in one run and not in another; its gradient goes elsewhere and AdamW's normalised update moves
#   whole elements by ~lr. Real MNIST, TF given torch's exact parameters before step 3: losses
#   equal to 6e-8, but one BN output is -3.6e-6 in torch and +1.2e-7 in TF, conv3's gradient
#   differs by 8% in that channel, and the free-running curves jump from 4e-6 to 4e-3 at step 4.
# - The flipped curves fall on a few branches, and the backends land on the probes' branches:
#   6 of 8 torch probes at 3e-6 on real MNIST jump at step 3-4 to the very 4e-3 TF shows at step
#   4; on synthetic data 4 of 8 jump at step 6 to MindSpore's 3e-4 (two match it for 20 steps). Which
#   probes flip is chance, so there are six of them: over every 6 of the 8 measured, the factor TF
#   and MindSpore needed was at most 1.06 (with 3 probes, up to 97); SENSITIVITY_FACTOR is 2.
# - Where nothing flips (the MLM: GELU and LayerNorm, no ReLU) the probes stay at rounding
#   (<= 3e-6) and so does the tolerance, which still catches a 4e-5 drift like Keras' epsilon
#   placement (backends/keras_common/optimizer.py).
ROUNDING_RTOL = 1e-5       # before any flip, the backends agree to float32 rounding (measured <= 5.6e-6)
PROBE_PERTURBATION = 3e-6
PROBE_SEEDS = (1, 2, 3, 4, 5, 6)
SENSITIVITY_FACTOR = 2.0


@dataclass
class Check:
    workload: str
    name: str
    status: str              # pass | fail | skip
    detail: str
    values: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def _spread(values: list[float]) -> float:
    """(max - min) / |mean|: the largest relative disagreement among the values."""
    mean = sum(values) / len(values)
    return (max(values) - min(values)) / max(abs(mean), 1e-30)


def curve_of(record: dict) -> list[float]:
    return [loss for _, loss in record["loss"]["curve"]]


def _ok(runs: dict[str, dict]) -> dict[str, dict]:
    return {b: r for b, r in runs.items() if r and r.get("status") == "ok"}


def _not_ok(runs: dict[str, dict]) -> str:
    return "; ".join(f"{b} {r.get('status')}: {(r.get('error') or '')[:120]}"
                     for b, r in runs.items() if r and r.get("status") != "ok")


def _equal_check(workload: str, name: str, values: dict[str, object], what: str) -> Check:
    if len(values) < 2:
        return Check(workload, name, "skip", f"fewer than two backends ran ({', '.join(values) or 'none'})", values)
    distinct = set(map(str, values.values()))
    status = "pass" if len(distinct) == 1 else "fail"
    return Check(workload, name, status, f"{what}: {'equal' if status == 'pass' else 'differ'} "
                                         f"across {', '.join(values)}", values)


def _deviation(curve: list[float], reference: list[float]) -> list[float]:
    return [abs(a - b) / max(abs(b), 1e-30) for a, b in zip(curve, reference)]


def sensitivity(reference: list[float], probes: list[list[float]]) -> list[float]:
    """Per step, the largest relative deviation any probe has reached from the reference by then
    (a flip, once it happened, stays in the curve: the envelope never shrinks)."""
    deviations = [_deviation(p, reference) for p in probes]
    envelope, worst = [], 0.0
    for step in range(len(reference)):
        worst = max([worst] + [d[step] for d in deviations if step < len(d)])
        envelope.append(worst)
    return envelope


def tolerances(envelope: list[float]) -> list[float]:
    return [max(ROUNDING_RTOL, SENSITIVITY_FACTOR * e) for e in envelope]


def _tolerance(envelope: list[float] | None, steps: int) -> list[float]:
    """Per step; without a measured envelope, rounding alone."""
    return tolerances(envelope)[:steps] if envelope else [ROUNDING_RTOL] * steps


def needs_sensitivity(checks: list[Check]) -> bool:
    """Whether a check failed that a measured sensitivity could pass: one held to a tolerance from the probes.
    Tolerances are never below ROUNDING_RTOL, so checks that hold without probes hold with them."""
    return any(c.status == "fail" and ("tolerance_per_step" in c.values or "tolerance" in c.values) for c in checks)


def _worst(deviation: list[float], tolerance: list[float]) -> tuple[int, float, bool]:
    """(step, deviation, within): the first step past its tolerance, else the largest deviation."""
    past = [s for s, (d, t) in enumerate(zip(deviation, tolerance)) if d > t]
    step = past[0] if past else max(range(len(deviation)), key=deviation.__getitem__)
    return step, deviation[step], not past


def probe_check(workload: str, reference: str | None, probes: list[dict], needed: bool = True) -> Check:
    """`needed` False: the perturbed runs were not made, since every check already held within rounding."""
    name = "reference's own sensitivity"
    if reference is None:
        return Check(workload, name, "skip", "no backend ran: nothing to probe")
    if not needed:
        return Check(workload, name, "skip", f"not measured: every curve and weight is within rounding "
                                             f"({ROUNDING_RTOL:.0e}) of {reference}'s, a tolerance no measured "
                                             "sensitivity would tighten (bench.parity --probes always measures it)")
    bad = [p for p in probes if p.get("status") != "ok"]
    if bad or not probes:
        return Check(workload, name, "fail", f"{reference} with perturbed initial weights did not run: "
                                             f"{_not_ok({p.get('run_id', '?'): p for p in bad}) or 'no probe'}; "
                                             f"curves held to {ROUNDING_RTOL:.0e} instead")
    return Check(workload, name, "pass", f"{reference} again with initial weights x (1 + {PROBE_PERTURBATION:.0e} "
                                         f"x N(0, 1)), {len(probes)} draws", {"probes": [curve_of(p) for p in probes]})


def cross_backend_checks(workload: str, spec_params: int, spec_flops: int, one: dict[str, dict],
                         two: dict[str, dict], reference: str | None = None,
                         envelope: list[float] | None = None) -> list[Check]:
    """Parameters, FLOPs, sample digests and losses across backends; `one`/`two`: backend -> record at
    N=1/2; losses against `reference`'s curve (default: the first that ran) within `tolerances(envelope)`."""
    ran = _ok(one)
    checks = []
    params = {b: r["params"] for b, r in ran.items()}
    check = _equal_check(workload, "parameter count", params, f"spec {spec_params}")
    if check.status == "pass" and set(params.values()) != {spec_params}:
        check.status, check.detail = "fail", f"backends agree on {next(iter(params.values()))}, spec says {spec_params}"
    checks.append(check)
    flops = {b: r["flops_per_sample"] for b, r in ran.items()}
    checks.append(_equal_check(workload, "FLOPs per sample", flops, f"analytical {spec_flops}"))
    for n, runs in ((1, one), (2, two)):
        digests = {b: r["sample_digests"] for b, r in _ok(runs).items()}
        check = _equal_check(workload, f"sample ids per device, N={n}", digests,
                             "SHA-256 per epoch and device of the ids each device trained on")
        if _not_ok(runs):
            check.detail += f" (not run: {_not_ok(runs)})"
        checks.append(check)

    if len(ran) < 2:
        checks.append(Check(workload, "loss at step 0", "skip", "fewer than two backends ran"))
        checks.append(Check(workload, "loss after step 0", "skip", "fewer than two backends ran"))
        return checks
    curves = {b: curve_of(r) for b, r in ran.items()}
    step0 = {b: c[0] for b, c in curves.items()}
    spread0 = _spread(list(step0.values()))
    checks.append(Check(workload, "loss at step 0", "pass" if spread0 <= STEP0_RTOL else "fail",
                        f"spread {spread0:.1e} (tolerance {STEP0_RTOL:.0e} relative)",
                        {"losses": step0, "spread": spread0}))
    reference = reference if reference in curves else next(iter(curves))
    steps = min(len(c) for c in curves.values())
    tolerance = _tolerance(envelope, steps)
    worst = {b: _worst(_deviation(c[:steps], curves[reference][:steps]), tolerance)
             for b, c in curves.items() if b != reference}
    failed = [b for b, (_, _, within) in worst.items() if not within or len(curves[b]) != len(curves[reference])]
    detail = "; ".join(f"{b} {d:.1e} at step {s} (tolerance there {tolerance[s]:.1e})"
                       for b, (s, d, _) in worst.items())
    checks.append(Check(workload, f"loss over {steps} steps", "fail" if failed else "pass",
                        f"largest deviation from {reference}: {detail}",
                        {"reference": reference, "curves": curves, "tolerance_per_step": tolerance,
                         "sensitivity_per_step": envelope[:steps] if envelope else None}))
    return checks


def data_parallel_checks(workload: str, one: dict[str, dict], two: dict[str, dict],
                         envelope: list[float] | None = None) -> list[Check]:
    """Per backend: the loss curve at N=2 against the same backend at N=1 with 2 micro-batches."""
    checks = []
    for backend in one:
        r1, r2 = one[backend], two.get(backend)
        name = f"{backend}: 2 devices = 1 device x 2 micro-batches"
        if r1.get("status") != "ok":
            checks.append(Check(workload, name, "fail" if r1.get("status") == "failed" else "skip",
                                f"1-device run {r1.get('status')}: {r1.get('error')}"))
        elif not r2 or r2.get("status") == "unsupported":
            checks.append(Check(workload, name, "skip", f"2 devices unsupported here: {(r2 or {}).get('error')}"))
        elif r2.get("status") != "ok":
            checks.append(Check(workload, name, "fail", f"2-device run failed: {r2.get('error')}"))
        else:
            c1, c2 = curve_of(r1), curve_of(r2)
            rel = _deviation(c2, c1)
            tolerance = _tolerance(envelope, len(rel))
            step, worst, within = _worst(rel, tolerance)
            status = "pass" if within and len(c1) == len(c2) else "fail"
            detail = f"largest relative difference {worst:.1e} at step {step} (tolerance there {tolerance[step]:.1e})"
            if len(c1) != len(c2):
                detail += f"; {len(c2)} steps at N=2, {len(c1)} at N=1"
            checks.append(Check(workload, name, status, detail, {"one": c1, "two": c2, "relative": rel,
                                                                 "tolerance_per_step": tolerance}))
    return checks


def run_status_checks(workload: str, one: dict[str, dict]) -> list[Check]:
    """A backend that failed at 1 device fails parity; one not available here is a skip with its reason."""
    checks = []
    for backend, record in one.items():
        status = record.get("status")
        if status != "ok":
            checks.append(Check(workload, f"{backend}: runs at 1 device", "fail" if status == "failed" else "skip",
                                f"{status}: {record.get('error')}"))
    return checks


def summary_line(checks: list[Check]) -> str:
    counts = {s: sum(c.status == s for c in checks) for s in ("pass", "fail", "skip")}
    verdict = "PARITY HOLDS" if counts["fail"] == 0 and counts["pass"] else "PARITY FAILS"
    return f"bench.parity: {verdict}: {counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped"


# ----------------------------------------------------------------------------- layouts

# Where a run exposes its final parameters, in `backend_metrics` (the channel a backend fills): per parameter
# name, the norm, sum and size of the whole (unsharded) weight (common.final_params). A layout must end where
# its 1-device run ends.


ONE_DEVICE = "1 device"


def final_params(record: dict) -> dict | None:
    return (record.get("backend_metrics") or {}).get(FINAL_PARAMS)


def _final_params_check(workload: str, name: str, reference: dict, run: dict, tolerance: float,
                        against: str = ONE_DEVICE) -> Check:
    title = f"{name}: final parameters = {against}"
    ref, got = final_params(reference), final_params(run)
    if not ref or not got:
        lacking = [w for w, r in (("the layout run", got), (f"the {against} run", ref)) if not r]
        return Check(workload, title, "skip", f"{' and '.join(lacking)} carr{'y' if len(lacking) > 1 else 'ies'} no "
                                              f"`backend_metrics.{FINAL_PARAMS}` (per-parameter norm and sum "
                                              "of the unsharded weights): nothing to compare")
    if set(ref) != set(got):
        only = sorted(set(ref) ^ set(got))
        return Check(workload, title, "fail", f"different parameters: {', '.join(only[:4])}")
    moved = [p for p in ref if weight_compared(ref[p])]
    worst_name, worst = max(((p, weight_deviation(ref[p], got[p])) for p in moved), key=lambda item: item[1])
    status = "pass" if worst <= tolerance else "fail"
    unmoved = f"; {len(ref) - len(moved)} weight(s) that only rounding moves not compared" if len(moved) < len(ref) \
        else ""
    return Check(workload, title, status, f"largest relative difference {worst:.1e} ({worst_name}; tolerance "
                                          f"{tolerance:.1e}: the loss curve's at its last step, or twice the "
                                          f"probes' weights if larger){unmoved}",
                 {"parameter": worst_name, "relative": worst, "tolerance": tolerance})


def weights_sensitivity(reference: dict, probes: list[dict]) -> float | None:
    """The largest deviation (common.final_params.deviation) of any probe's final weight from the reference's:
    how far float32-sized differences carry the final parameters, measured like the curves' envelope. AdamW
    turns rounding-sized gradient differences of small weights (the query biases) into lr-sized steps, so the
    weights drift further than the loss (measured on the tiny MLM over 6 steps: 7.8e-5 against 1e-5 for the
    curve), and two frameworks' rounding does the same."""
    ref = final_params(reference)
    got = [final_params(p) for p in probes]
    if not ref or not got or not all(got):
        return None
    return max(weight_deviation(ref[n], g[n]) for g in got for n in ref if weight_compared(ref[n]) and n in g)


def layout_checks(workload: str, name: str, reference: dict, run: dict,
                  envelope: list[float] | None = None, against: str = ONE_DEVICE,
                  weights: float | None = None) -> list[Check]:
    """One layout against the 1-device run of the same global batch and micro-batches (or, `against` another
    framework, that framework's run of the same layout): the loss at step 0 within STEP0_RTOL, the curve within
    the per-step tolerance, the final parameters within its last value. An unsupported run is a skip with its
    reason; a failed one, or a failed reference, a failure."""
    title = f"{name}: runs"
    if reference.get("status") != "ok":
        return [Check(workload, title, "fail" if reference.get("status") == "failed" else "skip",
                      f"{against} run {reference.get('status')}: {reference.get('error')}")]
    if run.get("status") != "ok":
        return [Check(workload, title, "fail" if run.get("status") == "failed" else "skip",
                      f"{run.get('status')}: {run.get('error')}")]
    c1, cn = curve_of(reference), curve_of(run)
    if not c1 or not cn:
        missing = "the layout run" if c1 else f"the {against} run"
        return [Check(workload, title, "fail", f"no loss curve in {missing}")]
    rel0 = _deviation(cn[:1], c1[:1])[0]
    checks = [Check(workload, f"{name}: loss at step 0 = {against}", "pass" if rel0 <= STEP0_RTOL else "fail",
                    f"relative difference {rel0:.1e} (tolerance {STEP0_RTOL:.0e})",
                    {"layout": cn[:1], "one": c1[:1]})]
    steps = min(len(c1), len(cn))
    tolerance = _tolerance(envelope, steps)
    step, worst, within = _worst(_deviation(cn[:steps], c1[:steps]), tolerance)
    detail = f"largest relative difference {worst:.1e} at step {step} (tolerance there {tolerance[step]:.1e})"
    if len(c1) != len(cn):
        detail += f"; {len(cn)} steps in the layout run, {len(c1)} in the {against} run"
    checks.append(Check(workload, f"{name}: loss over {steps} steps = {against}",
                        "pass" if within and len(c1) == len(cn) else "fail", detail,
                        {"one": c1, "layout": cn, "tolerance_per_step": tolerance}))
    weights_tolerance = max(tolerance[-1], SENSITIVITY_FACTOR * weights) if weights else tolerance[-1]
    checks.append(_final_params_check(workload, name, reference, run, weights_tolerance, against))
    return checks
