"""Importing kpo never needs verl: the plugin module is the only one that imports it (runs without verl)."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
sys.modules["verl"] = None  # any `import verl` now raises ImportError, as on a machine without verl
import kpo, kpo.integrations, kpo.losses, torch
zero = torch.zeros(1, 2)
loss, _ = kpo.policy_loss("kpo", log_prob=zero, old_log_prob=zero, advantages=torch.ones(1),
                          response_mask=torch.ones(1, 2, dtype=torch.bool))
assert loss.item() == -1.0, loss  # ratio 1, advantage 1: L = -A r~ = -1
try:
    import kpo.integrations.verl
except ImportError as err:
    print("plugin needs verl:", err)
else:
    raise AssertionError("kpo.integrations.verl imported without verl")
"""


def test_kpo_imports_without_verl():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "plugin needs verl" in out.stdout
