"""``fastload verify``: every record's checksum recomputed (and its image decoded); exit 1 when anything is wrong."""

from __future__ import annotations

import argparse
import sys

from fastload.cli.storage_options import storage_options
from fastload.cli.terminal import plural, shown


def verify_command(args: argparse.Namespace) -> int:
    from fastload.verifier import verify

    report = verify(args.path, decode=args.decode, storage_options=storage_options(args))
    for problem in report.problems:
        print(f"BAD {shown(problem)}", file=sys.stderr)
    for bad in report.bad:
        print(f"BAD {shown(bad)}", file=sys.stderr)
    status = "OK" if report.ok else "FAILED"
    fields = f" with their file fields ({', '.join(map(shown, report.file_fields))})" if report.file_fields else ""
    print(f"{status}: {report.checked} of {plural(report.num_records, 'record')} checked{fields}"
          f"{' and decoded' if args.decode else ''}, {len(report.bad)} bad, "
          f"{plural(len(report.problems), 'dataset problem')}")
    return 0 if report.ok else 1
