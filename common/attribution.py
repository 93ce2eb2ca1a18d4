"""Where a profiled step's time goes, from a profiler's op events: the framework-neutral arithmetic behind
`backend_metrics.attribution` (--profile; common.profile runs the steps, each framework reads its own trace).

Every framework hands over the same thing: its op events (name, start, end, thread, FLOPs where counted), the
profiled steps' windows in the events' clock, and its pattern table (`Rules`: (category, regex) in order,
the first that matches an event's path wins). Time is then given out once, so that the categories add up to
the step:
- on one thread, an instant belongs to the innermost event open then (an op's self time, as profilers count it);
- across threads, an instant in which several threads work is split evenly between them, and time in which
  only framework bookkeeping or waiting runs (category host_idle) goes to host_idle only when nothing works;
- what no event covers inside a step window is host_idle: Python, the framework's dispatch, the device waiting.
"""
from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from common.sections import ATTRIBUTION_CATEGORIES, COMM_KINDS, Attribution, CategoryTime

IDLE, OTHER = "host_idle", "other"
# What the report stacks: the categories of the record, grouped as issue #30 names them.
GROUPS: dict[str, tuple[str, ...]] = {
    "matmul": ("matmul",),
    "attention": ("attention",),
    "other compute": ("normalization", "activation", "softmax", "dropout_rng", "elementwise", "optimizer"),
    "communication": COMM_KINDS,
    "data movement": ("data_movement",),
    "host/idle": (IDLE,),
    "other": (OTHER,),
}
UNCLASSIFIED_SHOWN = 8
# The annotation each framework wraps a profiled step in (common.profile): its own time, between the step's
# ops, is the host's (Python, data, dispatch) in every framework.
STEP_MARKER = "parbench.step"
Rules = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class OpEvent:
    name: str        # what the profiler calls it (for XLA programs: the HLO op with what it fuses and its scope)
    start_s: float   # in the profiler's clock, as the step windows
    end_s: float
    thread: str
    flops: float = 0.0


class Classifier:
    """A framework's pattern table, checked once: every category is one of ATTRIBUTION_CATEGORIES."""

    def __init__(self, rules: Rules):
        unknown = [c for c, _ in rules if c not in ATTRIBUTION_CATEGORIES]
        if unknown:
            raise ValueError(f"unknown attribution categories {unknown}")
        self.rules = [(IDLE, re.compile(rf"^{re.escape(STEP_MARKER)}$")), *((c, re.compile(p)) for c, p in rules)]
        self._seen: dict[str, str] = {}

    def __call__(self, path: str) -> str:
        """The category of an event whose path (its enclosing events' names, then its own, joined by ' > ') is
        `path`; OTHER when no pattern matches."""
        if path not in self._seen:
            self._seen[path] = next((c for c, p in self.rules if p.search(path)), OTHER)
        return self._seen[path]


def _exclusive(events: list[OpEvent], classify: Classifier, flops: dict[str, float],
               windows: list[tuple[float, float]]) -> list[tuple[float, float, str, str]]:
    """One thread's events as (start, end, category, name) pieces that do not overlap: the innermost event open
    at each instant owns it. An event that outlives its parent is cut at the parent's end. Adds the FLOPs of the
    events that start in a window to `flops`, per category."""
    pieces, stack = [], []  # stack: (end, path, category, name)
    cursor = 0.0

    def close_until(t: float) -> None:
        nonlocal cursor
        while stack and stack[-1][0] <= t:
            end, _, category, name = stack.pop()
            if end > cursor:
                pieces.append((cursor, end, category, name))
            cursor = max(cursor, end)

    for e in sorted(events, key=lambda e: (e.start_s, -e.end_s)):
        close_until(e.start_s)
        if stack and e.start_s > cursor:
            pieces.append((cursor, e.start_s, stack[-1][2], stack[-1][3]))
        end = min(e.end_s, stack[-1][0]) if stack else e.end_s
        path = f"{stack[-1][1]} > {e.name}" if stack else e.name
        category = classify(path)
        if e.flops and any(w0 <= e.start_s < w1 for w0, w1 in windows):
            flops[category] += e.flops
        stack.append((end, path, category, e.name))
        cursor = e.start_s
    close_until(float("inf"))
    return pieces


def _clip(pieces: Iterable[tuple[float, float, str, str]], windows: list[tuple[float, float]]):
    for start, end, category, name in pieces:
        for w0, w1 in windows:
            s, e = max(start, w0), min(end, w1)
            if e > s:
                yield s, e, category, name


def split_time(events: list[OpEvent], windows: list[tuple[float, float]], classify: Classifier):
    """(seconds per category, seconds per unclassified name, FLOPs per category where counted, the mean number of
    threads running an op while any does) over the windows, all of the windows' time given out."""
    by_thread: dict[str, list[OpEvent]] = defaultdict(list)
    for e in events:
        if e.end_s > e.start_s:
            by_thread[e.thread].append(e)
    edges = []  # (time, +1/-1, category, name)
    flops: dict[str, float] = defaultdict(float)
    for thread_events in by_thread.values():
        for s, e, category, name in _clip(_exclusive(thread_events, classify, flops, windows), windows):
            edges += [(s, 1, category, name), (e, -1, category, name)]
    for w0, w1 in windows:  # window edges: time between steps is nobody's
        edges += [(w0, 0, "", ""), (w1, 0, "", "")]
    edges.sort(key=lambda x: (x[0], x[1]))
    seconds: dict[str, float] = defaultdict(float)
    unclassified: dict[str, float] = defaultdict(float)
    active: dict[tuple[str, str], int] = defaultdict(int)
    inside = [(w0, w1) for w0, w1 in windows]
    last, busy_s, thread_s = None, 0.0, 0.0
    for t, delta, category, name in edges:
        if last is not None and t > last and any(w0 <= last < w1 for w0, w1 in inside):
            threads = _give(t - last, active, seconds, unclassified)
            busy_s += (t - last) if threads else 0.0
            thread_s += (t - last) * threads
        if delta:
            active[(category, name)] += delta
            if not active[(category, name)]:
                del active[(category, name)]
        last = t
    return dict(seconds), dict(unclassified), dict(flops), thread_s / busy_s if busy_s else None


def _give(dt: float, active: dict[tuple[str, str], int], seconds: dict, unclassified: dict) -> int:
    """dt seconds to what runs in them: split evenly among the threads that work, else host_idle; how many work."""
    working = {k: n for k, n in active.items() if k[0] != IDLE}
    if not working:
        seconds[IDLE] += dt
        return 0
    total = sum(working.values())
    for (category, name), n in working.items():
        seconds[category] += dt * n / total
        if category == OTHER:
            unclassified[name] += dt * n / total
    return total


def attribution(events: list[OpEvent], windows: list[tuple[float, float]], classify: Classifier, *,
                wall_step_s: float, measured_step_s: float | None, profiler: str, trace_dir: str,
                model_flops_per_step: float | None = None,
                bytes_per_step: dict[str, float] | None = None) -> Attribution:
    """The record's section from one rank's profiled steps. bytes_per_step: per category the bytes it moves per
    step where counted elsewhere (e.g. the collectives of comm_per_step). model_flops_per_step: the spec's
    FLOPs of one step on this rank (matmuls and convolutions), held against the matmul and attention time."""
    steps = len(windows)
    seconds, unclassified, counted, concurrency = split_time(events, windows, classify)
    step_s = sum(w1 - w0 for w0, w1 in windows) / steps
    categories = {}
    for c in ATTRIBUTION_CATEGORIES:
        s = seconds.get(c, 0.0) / steps
        flops = counted.get(c, 0.0) / steps
        moved = (bytes_per_step or {}).get(c)
        categories[c] = CategoryTime(seconds=s, share=s / step_s if step_s else 0.0,
                                     flops_per_s=flops / s if flops and s else None,
                                     bytes_per_s=moved / s if moved and s else None)
    compute = categories["matmul"].seconds + categories["attention"].seconds
    top = sorted(unclassified.items(), key=lambda kv: -kv[1])[:UNCLASSIFIED_SHOWN]
    return Attribution(step_s=step_s, wall_step_s=wall_step_s, measured_step_s=measured_step_s, steps=steps,
                       categories=categories, profiler=profiler, trace_dir=trace_dir,
                       model_flops_per_s_in_matmul=model_flops_per_step / compute
                       if model_flops_per_step and compute else None,
                       unclassified=[[name, s / steps] for name, s in top], op_concurrency=concurrency)


def group_seconds(section: Attribution) -> dict[str, float]:
    """Seconds per step of each of the report's GROUPS."""
    return {g: section.seconds(*cats) for g, cats in GROUPS.items()}
