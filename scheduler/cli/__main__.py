"""``python -m scheduler.cli``: the ``gsched`` command."""

import sys

from scheduler.cli.main import main

sys.exit(main())
