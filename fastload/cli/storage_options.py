"""The ``--storage-option KEY=VALUE`` options every subcommand takes, as the library's ``storage_options``."""

from __future__ import annotations

import argparse
from typing import Any


def storage_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """The fsspec options of an object store named in the arguments; None when none was given."""
    from fastload.storage.location import parse_storage_options

    return parse_storage_options(args.storage_option) or None
