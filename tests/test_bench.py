"""`kpo bench` argument checks (the benchmarks themselves are run by hand: they time things)."""

from __future__ import annotations

import pytest

from kpo.bench import main


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_filter_rejects_repeats_below_one(value, capsys):
    # A median of no timed runs raised StatisticsError after the warm-up; now argparse refuses it up front.
    with pytest.raises(SystemExit) as e:
        main(["filter", "--repeats", value])
    assert e.value.code == 2
    assert f"--repeats: must be an integer >= 1, got '{value}'" in capsys.readouterr().err
