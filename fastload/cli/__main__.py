"""``python -m fastload.cli``: the ``fastload`` command."""

import sys

from fastload.cli import main

sys.exit(main())
