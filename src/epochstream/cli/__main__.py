"""``python -m epochstream.cli``: the ``epochstream`` command line."""

import sys

from epochstream.cli import main

sys.exit(main())
