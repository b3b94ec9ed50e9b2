"""The ``fastload`` command: a thin argparse front over library calls, one function per subcommand.

    parser.py     the arguments of each subcommand (``build_parser``)
    commands.py   one function per subcommand: a library call, its output printed
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from fastload.cli.parser import build_parser
from fastload.errors import FastloadError


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fastload`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:  # `fastload info ... | head`: the reader has what it wanted
        # Python would complain again while flushing stdout at exit: point it at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # what a shell reports for a process ended by SIGPIPE (128 + 13), as `cat | head`
    except KeyboardInterrupt:
        print("fastload: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except (FastloadError, ValueError, OSError) as exc:
        print(f"fastload: error: {exc}", file=sys.stderr)
        return 2
