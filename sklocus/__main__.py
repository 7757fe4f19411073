"""``python -m sklocus``: the ``sklocus`` command (see :mod:`sklocus.cli`)."""

import sys

from sklocus.cli import main

if __name__ == "__main__":
    sys.exit(main())
