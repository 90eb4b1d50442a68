"""Train a model on a state-tracking task with a length curriculum (docs/state_tracking.md).

Usage: ``python tools/state_tracking.py --help``. The code: ``titan_delta.state_tracking.cli``.
"""

import sys

from titan_delta.state_tracking.cli import main

if __name__ == "__main__":
    sys.exit(main())
