"""``python -m titan_delta.eval``: see :mod:`titan_delta.eval.cli`."""

import sys

from titan_delta.eval.cli import main

sys.exit(main())
