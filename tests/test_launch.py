"""common.launch.run_supervised_group: one failing rank takes the others down; a timeout kills all."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from common.launch import RunFailed, child_env, run_supervised_group


def _py(code: str, log: Path) -> tuple[list[str], dict[str, str], Path]:
    return [sys.executable, "-c", code], child_env({}), log


def test_first_failure_stops_the_others(tmp_path: Path):
    started = time.monotonic()
    codes = run_supervised_group([_py("import sys; sys.exit(3)", tmp_path / "0.log"),
                                  _py("import time; time.sleep(60)", tmp_path / "1.log")], timeout_s=30)
    assert codes[0] == 3 and codes[1] < 0  # the sleeper was killed by a signal
    assert time.monotonic() - started < 20


def test_all_succeed(tmp_path: Path):
    assert run_supervised_group([_py("print('hi')", tmp_path / f"{i}.log") for i in range(2)], timeout_s=30) == [0, 0]
    assert (tmp_path / "0.log").read_text().strip() == "hi"


def test_timeout_kills_every_rank(tmp_path: Path):
    with pytest.raises(RunFailed, match="timed out"):
        run_supervised_group([_py("import time; time.sleep(60)", tmp_path / f"{i}.log") for i in range(2)],
                             timeout_s=1)
