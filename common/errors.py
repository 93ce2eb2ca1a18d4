"""The three ways a run can end other than `ok`, mapped to the exit codes of CONVENTIONS §3."""
from __future__ import annotations

import signal

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_UNSUPPORTED = 3


class BadInput(Exception):
    """The user asked for something that cannot be run as asked: exit 2, one line, no record."""


class Unsupported(Exception):
    """The run is valid but this machine cannot do it: a record with status `unsupported`, exit 3."""


class DataError(BadInput):
    """A data file is missing, truncated or corrupt; the message names the file."""


class Cancelled(BaseException):
    """SIGINT or SIGTERM reached the harness: stop what was started, write no record, exit 128 + signal
    (130 for Ctrl-C, 143 for SIGTERM, as a shell reports them). A BaseException, like KeyboardInterrupt,
    so that no `except Exception` on the way up mistakes it for a failed run and records it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.exit_code = 128 + signum
        self.name = signal.Signals(signum).name
