"""``python -m kpo``: the ``kpo`` command (what ``torchrun -m kpo train ...`` and ``python -m kpo.launch`` run)."""

import sys

from kpo.cli import main

sys.exit(main())
