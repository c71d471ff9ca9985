"""The stable public names of DESIGN.md, and the `kpo` command dispatcher."""

from __future__ import annotations

import subprocess
import sys

import pytest

import kpo
from kpo.cli import COMMANDS, main

PUBLIC = (
    "kalman_filter",
    "kalman_gains",
    "policy_loss",
    "list_losses",
    "compute_advantages",
    "token_dynamics",
)


def test_public_names_resolve_to_their_modules():
    for name in PUBLIC:
        assert callable(getattr(kpo, name)), name
    assert kpo.kalman_filter is __import__("kpo.filter", fromlist=["x"]).kalman_filter
    assert set(PUBLIC) < set(dir(kpo))
    with pytest.raises(AttributeError, match="no attribute 'not_there'"):
        kpo.not_there  # noqa: B018


def test_import_kpo_pulls_in_no_engine():
    # The loss and filter layers are for TRL and verl users alike: importing them must not import either host.
    code = "import sys, kpo; kpo.policy_loss; kpo.kalman_filter; print(sorted(m for m in ('trl', 'verl', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_cli_lists_commands_and_rejects_unknown_ones(capsys):
    assert main([]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in COMMANDS)
    assert main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err
