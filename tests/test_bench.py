"""`kpo bench`: argument checks, a smoke run at a tiny size (numbers finite, paths agreeing) and the authors'
closed form it compares against (timings are never asserted: the machine is shared)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from kpo.bench import main
from kpo.filter.authors import authors_closed_form


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_filter_rejects_repeats_below_one(value, capsys):
    # A median of no timed runs raised StatisticsError after the warm-up; now argparse refuses it up front.
    with pytest.raises(SystemExit) as e:
        main(["filter", "--repeats", value])
    assert e.value.code == 2
    assert f"--repeats: must be an integer >= 1, got '{value}'" in capsys.readouterr().err


def _parse_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "q"])
def test_filter_rejects_a_process_noise_that_is_not_positive_and_finite(value, capsys):
    # gains.check_params' error must be one line, not a ValueError traceback from inside the benchmark.
    err = _parse_error(["filter", "--sizes", "4x16", "--q", value], capsys)
    assert f"argument --q: must be a finite number > 0 (the process noise Q; V = 1), got '{value}'" in err


def test_filter_checks_the_plot_path_before_running(tmp_path, capsys, monkeypatch):
    import kpo.bench

    # A bad --plot must fail at once, not with a FileNotFoundError after the whole benchmark has run.
    monkeypatch.setattr(kpo.bench, "_bench_size", lambda *a: pytest.fail("the benchmark ran"))
    err = _parse_error(["filter", "--sizes", "4x16", "--plot", str(tmp_path / "nope" / "x.png")], capsys)
    assert f"argument --plot: {str(tmp_path / 'nope')!r} is not an existing directory" in err
    assert "is a directory" in _parse_error(["filter", "--plot", str(tmp_path)], capsys)
    assert "matplotlib cannot write '.foo' files" in _parse_error(
        ["filter", "--plot", str(tmp_path / "x.foo")], capsys
    )


@pytest.mark.parametrize("arch", ["7", "60", "88", "101"])
def test_triton_ptx_takes_only_architectures_triton_compiles_for(arch, capsys):
    # sm_7 and sm_88 would abort the process inside LLVM; sm_101 would fail in ptxas.
    err = _parse_error(["triton-ptx", "--arch", arch], capsys)
    assert f"argument --arch: invalid choice: {arch} (choose from 70, 72, 75, 80" in err


def test_filter_reports_minimum_and_median_for_every_mode(capsys):
    # Every table holds the minimum and the median of interleaved repeats; the copy is into a warm buffer
    # and the header names the machine, so that README numbers say where they come from.
    assert main(["filter", "--sizes", "8x130", "--repeats", "3", "--mode", "all", "--mask", "full"]) == 0
    out = capsys.readouterr().out
    assert "cores" in out.splitlines()[0] and "mask=full" in out.splitlines()[0]
    for mode in ("zero", "skip", "advance"):
        assert f"forward  mode={mode} B=8 T=130" in out
        assert f"forward + backward  mode={mode} B=8 T=130" in out
    assert out.count("ms min") == out.count("ms med") == 6
    assert out.count("memory copy (into a warm buffer)") == 6
    errors = [float(e) for e in re.findall(r"kalman_filter \[\w+\].*max err ([0-9.e+-]+)", out)]
    assert len(errors) >= 3 and max(errors) < 1e-6


def test_filter_smoke_run_prints_finite_rows_and_paths_that_agree(capsys):
    # every timed row's numbers are finite; every path's output and gradient (all rows, padded
    # and holed-free masks) agrees with the first path's to float32 rounding of |z| ~ 0.05 (float32 input)
    argv = ["filter", "--sizes", "6x200,3x70", "--repeats", "2", "--mode", "all", "--q", "1e-3"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^  (\S.*?)\s{2,}((?:[-+0-9.e]+|nan|inf)(?:\s+(?:[-+0-9.e]+|nan|inf)){5})", out, re.M)
    assert len(rows) >= 2 * 3 * 2 * 4  # sizes x modes x (forward, both) x (copy, paths, closed form)
    for label, numbers in rows:
        values = [float(x) for x in numbers.split()]
        # ms min, ms med, G tokens/s (printed to 3 decimals: 0 at this size), x closed, (med), copies
        assert all(math.isfinite(x) and x >= 0 for x in values) and values[0] > 0, (label, values)
    agree = re.findall(r"(outputs|gradients) agree: max \|\w+ - \w+\| = ([0-9.e+-]+)", out)
    assert len(agree) == 2 * 3 * 2 * (len(re.findall(r"kalman_filter \[", out)) // 6 - 1)
    assert agree and all(float(diff) <= 2e-7 for _, diff in agree), agree
    errors = [float(e) for e in re.findall(r"kalman_filter \[\w+\].*max err ([0-9.e+-]+)$", out, re.M)]
    assert errors and max(errors) < 2e-7 and "NaN/Inf" not in out


def test_authors_closed_form_clamps_its_gains_to_1e_6_and_1_minus_1e_6():
    # q/v = 3e-7: the first gains (3e-7, 6e-7) are raised to 1e-6, so z = 1 gives 1e-6, then ~2e-6
    out = authors_closed_form(torch.ones(1, 4), torch.ones(1, 4), 3e-7, 1.0)
    torch.testing.assert_close(out[0, :2], torch.tensor([1e-6, 2e-6]), rtol=1e-3, atol=0)
    # q/v = 1e8: the first gain 1 - 1e-8 is lowered to 1 - 1e-6, so a step of z = 0 leaves ~1e-6 of z_0 = 1
    out = authors_closed_form(torch.tensor([[1.0, 0.0, 0.0]]), torch.ones(1, 3), 1e8, 1.0)
    torch.testing.assert_close(out[0, :2], torch.tensor([1 - 1e-6, 1e-6]), rtol=0.05, atol=0)


def test_interleaved_minimum_is_at_most_the_median():
    from kpo.bench import _interleaved

    calls = []
    times = _interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 4, lambda: None)
    assert calls == ["a", "b"] * 5  # one warm-up round, then four interleaved rounds
    assert all(lo <= med for lo, med in times.values())
