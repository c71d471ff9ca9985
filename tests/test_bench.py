"""`kpo bench` argument checks (the benchmarks themselves are run by hand: they time things)."""

from __future__ import annotations

import re

import pytest

from kpo.bench import main


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
    # gains.check_params used to raise a ValueError traceback from inside the benchmark.
    err = _parse_error(["filter", "--sizes", "4x16", "--q", value], capsys)
    assert f"argument --q: must be a finite number > 0 (the process noise Q; V = 1), got '{value}'" in err


def test_filter_checks_the_plot_path_before_running(tmp_path, capsys, monkeypatch):
    import kpo.bench

    # A bad --plot used to fail with FileNotFoundError only after the whole benchmark had run.
    monkeypatch.setattr(kpo.bench, "_bench_size", lambda *a: pytest.fail("the benchmark ran"))
    err = _parse_error(["filter", "--sizes", "4x16", "--plot", str(tmp_path / "nope" / "x.png")], capsys)
    assert f"argument --plot: {str(tmp_path / 'nope')!r} is not an existing directory" in err
    assert "is a directory" in _parse_error(["filter", "--plot", str(tmp_path)], capsys)
    assert "matplotlib cannot write '.foo' files" in _parse_error(
        ["filter", "--plot", str(tmp_path / "x.foo")], capsys
    )


@pytest.mark.parametrize("arch", ["7", "60", "88", "101"])
def test_triton_ptx_takes_only_architectures_triton_compiles_for(arch, capsys):
    # sm_7 and sm_88 used to abort the process inside LLVM; sm_101 failed in ptxas.
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


def test_interleaved_minimum_is_at_most_the_median():
    from kpo.bench import _interleaved

    calls = []
    times = _interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 4, lambda: None)
    assert calls == ["a", "b"] * 5  # one warm-up round, then four interleaved rounds
    assert all(lo <= med for lo, med in times.values())
