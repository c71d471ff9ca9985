"""``python -m kpo``: the ``kpo`` command (what ``torchrun -m kpo train ...`` and ``kpo launch`` run)."""

import sys

from kpo._distributed import leave, world_size
from kpo.cli import main

code = main()
if world_size() > 1:
    leave(code)
sys.exit(code)
