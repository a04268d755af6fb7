"""`python -m pyspk`: the `pyspk` command."""

import sys

from pyspk.cli import main

if __name__ == "__main__":
    sys.exit(main())
