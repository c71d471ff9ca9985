"""`kpo compare` and `kpo compare regimes` check the held-out size against the task's test split before any
problem is drawn (issue 41: `--eval-limit 100000000 --plan` hung with no output, building the running task's
test problems for about 15 hours). No test here trains or draws more problems than the checks need."""

from __future__ import annotations

import pytest

from data.draws import no_more_draws
from kpo.compare.cli import main

# the running task at 12 digits (10^11 test problems, like the default's 10^127 far more than kpo draws) with a
# small warm start, so that checking each run's config is quick
TASK = ("--", "--n-terms", "12", "--sft-examples", "64")
# what the checks draw: the RL split (4096 of its problems), a warm-start round and the default test split
CHECKS_DRAW = 20_000


@pytest.mark.parametrize("command", [[], ["regimes", "--cells", "none-depth4-lr0.0001"]])
def test_an_eval_limit_beyond_the_test_split_is_refused_at_once(
    tmp_path, monkeypatch, capsys, no_training, command
):
    no_more_draws(monkeypatch, CHECKS_DRAW)
    out = tmp_path / "cmp"
    assert main([*command, "--out", str(out), "--eval-limit", "100000000", "--plan", *TASK]) == 2
    err = capsys.readouterr().err
    assert "--eval-limit=100000000: n=100000000: 100000000 test problems requested" in err, err
    assert "allows at most 1000000" in err and "ask for 1000000 or fewer" in err, err
    assert "Traceback" not in err and not out.exists()
