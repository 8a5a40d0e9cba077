"""``python -m toolkit``: the command line (toolkit.cli)."""

import sys

from toolkit.cli import main

sys.exit(main())
