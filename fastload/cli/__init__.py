"""The ``fastload`` command: a thin argparse front over library calls, one function per subcommand.

    parser.py           the arguments of each subcommand (``build_parser``)
    pack.py             ``pack``: a source packed into a dataset, here or on Ray
    info.py             ``info``: what a dataset holds and how it was packed
    show.py             ``show``: one record printed, its image written to a new file
    output_file.py      a file written for the user: new, never through a link or into a dataset
    verify.py           ``verify``: every record's checksum recomputed
    measure.py          ``tune``, ``bench``, ``doctor``: loaders measured on this machine
    terminal.py         untrusted text made harmless to print, counts in words
    storage_options.py  ``--storage-option`` as the library's ``storage_options``
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from fastload.cli.parser import build_parser
from fastload.cli.terminal import shown
from fastload.errors import FastloadError, SourceError


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fastload`` console script; returns the exit status."""
    parser = build_parser()
    argv = _old_spellings(list(sys.argv[1:] if argv is None else argv))
    args, extra = parser.parse_known_args(argv)
    try:
        if extra:
            _refuse_extra(parser, args, argv, extra)
        return args.run(args)
    except BrokenPipeError:  # `fastload info ... | head`: the reader has what it wanted
        # Python would complain again while flushing stdout at exit: point it at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # what a shell reports for a process ended by SIGPIPE (128 + 13), as `cat | head`
    except KeyboardInterrupt:
        print("fastload: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except (FastloadError, ValueError, OSError) as exc:
        print(f"fastload: error: {shown(exc)}", file=sys.stderr)  # it may quote a dataset's or a source's names
        return 2


def _old_spellings(argv: list[str]) -> list[str]:
    """``pack --ray=ADDRESS`` (``--ray`` took a value once) as ``--ray --ray-address ADDRESS``."""
    out: list[str] = []
    for at, arg in enumerate(argv):
        if arg == "--":  # what follows is positional, as written
            return out + argv[at:]
        out += ["--ray", "--ray-address", arg.split("=", 1)[1]] if arg.startswith("--ray=") else [arg]
    return out


def _refuse_extra(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str],
                  extra: list[str]) -> None:
    """Arguments no option took: for ``pack``, more than one SRC (said in words that help); else
    argparse's own "unrecognized arguments" (exit 2)."""
    if args.command != "pack" or any(e.startswith("-") for e in extra):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    at = argv.index(extra[0])
    if args.ray and at > 0 and argv[at - 1] == "--ray":
        raise SourceError(f"--ray {extra[0]}: --ray takes no value; give the cluster's address with "
                          f"--ray-address {extra[0]} (or in RAY_ADDRESS)")
    raise SourceError(f"fastload pack takes one SRC, got {1 + len(extra)} ({args.src}, {extra[0]}, ...); for "
                      "several tars, quote a brace list ('data-{000..099}.tar', which your shell would "
                      "otherwise expand) or pass the folder that holds them")
