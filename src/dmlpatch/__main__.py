"""``python -m dmlpatch``: see :mod:`dmlpatch.cli`."""

import sys

from dmlpatch.cli import main

if __name__ == "__main__":
    sys.exit(main())
