"""Fetch or check the public data files.

    python -m bench.data download [--data-dir DIR] [--datasets mnist,wikitext-2] [--mirror URL]
                                  [--timeout S] [--force]
    python -m bench.data verify   [--data-dir DIR] [--datasets mnist,wikitext-2]

Exit 0 on success; 1 when a download fails or verify finds problems; 2 on bad input, with one
line on stderr (CONVENTIONS §3).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from common.data.download import DATASET_NAMES, DEFAULT_DATASETS, download, verify
from common.data.files import DATA_DIR_ENV, resolve_data_dir
from common.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, BadInput, DataError

PROG = "bench.data"


class _Parser(argparse.ArgumentParser):
    """Reports bad usage as one line and exit 2, instead of argparse's usage block."""

    def error(self, message: str) -> NoReturn:
        # Fixed prefix: subcommand parsers would otherwise say "bench.data download: error".
        _say_error(message)
        sys.exit(EXIT_BAD_INPUT)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    data_dir = resolve_data_dir(args.data_dir)
    try:
        if args.command == "download":
            return _download(data_dir, args)
        return _verify(data_dir, args.datasets)
    except DataError as exc:  # before BadInput, its base: a failed download is not bad usage
        _say_error(str(exc))
        return EXIT_FAILED
    except BadInput as exc:
        _say_error(str(exc))
        return EXIT_BAD_INPUT


def _download(data_dir: Path, args: argparse.Namespace) -> int:
    download(data_dir, args.datasets, mirror=args.mirror, timeout=args.timeout, force=args.force)
    print(f"data ready in {data_dir}")
    return EXIT_OK


def _verify(data_dir: Path, datasets: tuple[str, ...]) -> int:
    problems = verify(data_dir, datasets)
    for problem in problems:
        print(problem)
    if problems:
        return EXIT_FAILED
    print(f"all files of {', '.join(datasets)} verified in {data_dir}")
    return EXIT_OK


def _say_error(message: str) -> None:
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)


def _dataset_list(raw: str) -> tuple[str, ...]:
    # Names are checked by the library, so that the CLI and callers share one message.
    return tuple(name.strip() for name in raw.split(",") if name.strip())


def build_parser() -> _Parser:
    parser = _Parser(prog=PROG, description="Fetch or check the public data files.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{download,verify}")
    shared = _Parser(add_help=False)
    shared.add_argument("--data-dir", help=f"data dir (default: ${DATA_DIR_ENV}, else ~/.cache/parbench)")
    shared.add_argument("--datasets", type=_dataset_list, default=DEFAULT_DATASETS,
                        help=f"comma-separated, from {','.join(DATASET_NAMES)} (default: all)")

    get = commands.add_parser("download", parents=[shared], help="fetch missing or corrupt files")
    get.add_argument("--mirror", help="base URL laid out like the data dir; the only source used")
    get.add_argument("--timeout", type=float, default=60.0, help="socket timeout in seconds (default: 60)")
    get.add_argument("--force", action="store_true", help="fetch again even files that verify")

    commands.add_parser("verify", parents=[shared], help="check sizes and sha256 of the files")
    return parser


if __name__ == "__main__":
    sys.exit(main())
