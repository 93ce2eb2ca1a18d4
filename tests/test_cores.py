"""Which cores a rank or a process runs on (common.devices.process_cores, torch's pin_to_cores)."""
from __future__ import annotations

import os

import pytest

from common.devices import process_cores


@pytest.mark.parametrize(("allowed", "first", "wanted", "cores"), [
    ([0, 1], 0, 1, [0]),
    ([0, 1], 1, 1, [1]),
    ([4, 5, 6, 7], 2, 2, [6, 7]),
    ([4, 5, 6, 7], 3, 2, [4, 7]),        # past the last core: round again from the first
    ([0, 1], 0, 3, [0, 1]),              # more threads than cores: every core, none stacked
])
def test_a_process_gets_its_own_cores_while_they_last(allowed, first, wanted, cores):
    assert process_cores(allowed, first, wanted) == cores


def pinned(monkeypatch, rank: int, threads: int, ranks: int) -> list[int]:
    """The cores pin_to_cores leaves this process on, the process's own put back after."""
    from backends.torch_common.process_group import pin_to_cores

    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(ranks))
    before = os.sched_getaffinity(0)
    try:
        pin_to_cores(rank, threads)
        return sorted(os.sched_getaffinity(0))
    finally:
        os.sched_setaffinity(0, before)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two cores to choose from")
def test_torch_ranks_of_a_node_that_fit_its_cores_take_one_each_and_a_lone_or_crowded_rank_stays_free(monkeypatch):
    cores = sorted(os.sched_getaffinity(0))
    assert pinned(monkeypatch, 0, 1, 2) == [cores[0]] and pinned(monkeypatch, 1, 1, 2) == [cores[1]]
    assert pinned(monkeypatch, 0, 1, 1) == cores                  # a lone rank: two such runs stay apart
    assert pinned(monkeypatch, 1, 1, len(cores) + 1) == cores     # oversubscribed: the kernel spreads them
