"""``python -m dmlpatch``: see :mod:`dmlpatch.commands.cli`."""

import sys

from dmlpatch.commands.cli import main

if __name__ == "__main__":
    sys.exit(main())
