"""How `nox -s tests` shares the suite between pytest-xdist workers (`-p tests.xdist_groups`): each file's tests on
one worker, so that its module fixtures are made once; the files that read one session fixture's sweep
(tests/conftest.py) on one worker, so that the sweep is made once; and the groups that take minutes handed out
first, so that no worker is left with one of them while the other idles at the end. The tests marked quiet run
after, alone, from QUIET_FILES only (collecting every file imports every framework: 14 s).

A scheduler of its own (xdist's pytest_xdist_make_scheduler), not `--dist loadgroup` with xdist_group marks: xdist
3.8 groups by a suffix it writes into each item's node id, which pytest 9.2 no longer lets it set (the marks are
silently ignored and a file's tests spread over both workers)."""
from __future__ import annotations

SHARED_SWEEPS = {"test_torch_dp": "torch_sweep", "test_torch_ddp": "torch_sweep", "test_config_key": "torch_sweep",
                 "test_layouts": "layout_sweep", "test_torch_3d": "layout_sweep", "test_plan": "layout_sweep",
                 "test_predict": "layout_sweep"}
# Measured on 2 cores, longest first (docs/testing.md); a group not named here follows in the files' order.
LONGEST_FIRST = ("test_mindspore_auto", "test_parity", "torch_sweep", "layout_sweep", "test_gpu_check",
                 "test_tf_mirrored", "test_lm", "test_keras_jax", "test_lm_keras", "test_multihost", "test_faults",
                 "test_slurm", "test_plan_decoders", "test_concurrent_sweeps", "test_report", "test_calibrate",
                 "test_cancel", "test_cli")
QUIET_FILES = ("tests/test_calibrate.py",)


def group_of(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
    return SHARED_SWEEPS.get(module, module)


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling  # here: noxfile imports QUIET_FILES without xdist

    class FilesAndSweeps(LoadScopeScheduling):
        """xdist's scope scheduling (one scope's tests on one worker, scopes in collection order) by group_of."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return FilesAndSweeps(config, log)


def pytest_collection_modifyitems(items):
    """Called before pytest's own (a plugin given with -p is registered after it): every item, -m not applied yet."""
    # A quiet test outside QUIET_FILES would run in neither phase of `nox -s tests`.
    strays = [item.nodeid for item in items if item.get_closest_marker("quiet")
              and item.nodeid.split("::", 1)[0] not in QUIET_FILES]
    if strays:
        import pytest  # here: noxfile imports QUIET_FILES where pytest is not installed

        raise pytest.UsageError(f"tests marked quiet outside tests/xdist_groups.py's QUIET_FILES: {strays}")
    # Every worker collects, in the same order; the scheduler hands the groups out in that order.
    rank = {group: i for i, group in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(group_of(item.nodeid), len(rank)))
