"""Convert a Hugging Face folder into a DCP checkpoint to continue pretraining from (docs/hf.md).

Usage: ``python tools/import_checkpoint.py --help``. The code: ``titan_delta.hf.import_cli``.
"""

import sys

from titan_delta.hf.import_cli import main

if __name__ == "__main__":
    sys.exit(main())
