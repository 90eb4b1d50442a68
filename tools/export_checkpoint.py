"""Convert a training checkpoint (DCP folder) into a Hugging Face folder (docs/hf.md).

Usage: ``python tools/export_checkpoint.py --help``. The code: ``titan_delta.hf.export_cli``.
"""

import sys

from titan_delta.hf.export_cli import main

if __name__ == "__main__":
    sys.exit(main())
