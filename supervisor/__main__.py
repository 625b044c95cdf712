"""``python -m supervisor`` is ``rvsup``."""

import sys

from supervisor.cli import main

sys.exit(main())
