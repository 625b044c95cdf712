"""``python -m supervisor`` is ``rvsup``."""

import sys

from .cli import main

sys.exit(main())
