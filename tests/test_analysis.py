"""``kpo analyze``: loading and validating dumps, the computed tables, and the command writing its files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from kpo import kalman_filter
from kpo.analysis import (
    AnalyzeConfig,
    DumpError,
    compute,
    find_dumps,
    load_dump,
    plots,
    synthetic_dump,
    write_dump,
    write_synthetic,
)
from kpo.analysis.cli import main
from kpo.diagnostics import STAT_KEYS, token_dynamics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _dump(path, log_ratio, mask, filtered=None, **meta):
    tensors = {"log_ratio": np.asarray(log_ratio, np.float32), "mask": np.asarray(mask, np.uint8)}
    if filtered is not None:
        tensors["filtered_log_ratio"] = np.asarray(filtered, np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={k: str(v) for k, v in meta.items()})
    return path


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory):
    """One end-to-end `kpo analyze --synthetic` (figures included), shared by the checks below."""
    out = tmp_path_factory.mktemp("analyze") / "out"
    argv = ["--synthetic", "--out", str(out), "--samples", "6", "--length", "160", "--examples", "2"]
    return out, main(argv)


def test_synthetic_command_writes_every_file(synthetic_run, capsys):
    out, rc = synthetic_run
    assert rc == 0
    for name in ("report.md", "table2.md", "table2.json", "sweep.md", "sweep.json"):
        assert (out / name).stat().st_size > 0, name
    for name in ("figure1_traces.png", "figure1_dynamics.png", "figure4_sweep.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC, name
    assert (out / "synthetic" / "ratios" / "step_000000.safetensors").is_file()
    report = (out / "report.md").read_text()
    assert "![traces](figure1_traces.png)" in report and "## Table 2" in report
    table = (out / "table2.md").read_text().splitlines()
    assert table[0].startswith("| | prop up | prop down | prop on | run-len up")
    assert table[2].startswith("| Before KF (exact on, r = 1) |")


def test_synthetic_tables_match_the_library(synthetic_run):
    out, _ = synthetic_run
    res = json.loads((out / "table2.json").read_text())
    dump = load_dump(out / "synthetic" / "ratios" / "step_000000.safetensors")
    before = token_dynamics(dump.log_ratio, dump.mask)
    after = token_dynamics(dump.filtered, dump.mask, eps_low=3e-4, eps_high=4e-4)
    for key in STAT_KEYS:
        for got, want in ((res["before"][key], before[key]), (res["after"][key], after[key])):
            assert got == pytest.approx(want, rel=1e-12, abs=1e-15) if want == want else got is None
    assert res["inputs"]["samples"] == 6
    sweep = json.loads((out / "sweep.json").read_text())
    assert [r["q"] for r in sweep["rows"]] == [1e-6, 1e-4, 1e-2] and sweep["v"] == 1.0
    # stronger smoothing (smaller Q/V) must give longer runs and fewer switches on this drifting trace
    switch = [r["switch_freq"] for r in sweep["rows"]]
    assert switch[0] <= switch[1] <= switch[2] < res["before"]["switch_freq"]


def test_synthetic_dump_is_seeded_padded_and_holed(tmp_path):
    a = synthetic_dump(seed=3, samples=40, length=100)
    b = synthetic_dump(seed=3, samples=40, length=100)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["log_ratio"], synthetic_dump(seed=4, samples=40, length=100)["log_ratio"])
    m = a["mask"].astype(bool)
    n = m.sum(axis=1)
    last = np.array([np.flatnonzero(r).max() for r in m])
    assert (last < 100).all() and (n >= 100 // 4 - 20).all()
    holes = (m[:, :-1] & ~m[:, 1:]).sum(axis=1) > 1  # a 1->0 step before the last valid token: a hole
    holes |= (~m[:, :-1] & m[:, 1:]).any(axis=1)
    assert holes.any(), "some responses must have a masked hole"
    assert (a["log_ratio"][~m] == 0).all() and (a["log_ratio"][m] == 0).any()
    written = load_dump(write_synthetic(tmp_path, seed=3, samples=40, length=100))
    np.testing.assert_array_equal(written.log_ratio, a["log_ratio"])
    assert written.meta["q"] == "1e-06" and written.meta["mask_mode"] == "skip"
    ref = kalman_filter(
        torch.from_numpy(a["log_ratio"].astype(np.float64)), torch.from_numpy(m), q=1e-6, v=1.0
    )
    np.testing.assert_allclose(written.filtered, ref.numpy(), rtol=1e-6, atol=1e-9)


def test_find_dumps_file_run_dir_and_ratios_dir(tmp_path):
    z, m = np.zeros((1, 3)), np.ones((1, 3))
    second = _dump(tmp_path / "run" / "ratios" / "step_000002.safetensors", z, m)
    first = _dump(tmp_path / "run" / "ratios" / "step_000001.safetensors", z, m)
    assert find_dumps(tmp_path / "run") == [first, second]
    assert find_dumps(tmp_path / "run" / "ratios") == [first, second]
    assert find_dumps(second) == [second]
    with pytest.raises(DumpError, match="no such file"):
        find_dumps(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DumpError, match=r"empty: no ratio dumps"):
        find_dumps(tmp_path / "empty")


@pytest.mark.parametrize(
    ("tensors", "meta", "message"),
    [
        ({"log_ratio": np.zeros((2, 3), np.float32)}, {}, r"missing tensor 'mask'"),
        ({"mask": np.ones((2, 3), np.uint8)}, {}, r"missing tensor 'log_ratio'"),
        (
            {"log_ratio": np.zeros((2, 3), np.float32), "mask": np.ones((2, 4), np.uint8)},
            {},
            r"shape mismatch: mask is \(2, 4\) but log_ratio is \(2, 3\)",
        ),
        (
            {
                "log_ratio": np.zeros((2, 3), np.float32),
                "mask": np.ones((2, 3), np.uint8),
                "filtered_log_ratio": np.zeros((3, 2), np.float32),
            },
            {},
            r"shape mismatch: filtered_log_ratio is \(3, 2\)",
        ),
        (
            {"log_ratio": np.array([[0, np.nan, 0]], np.float32), "mask": np.ones((1, 3), np.uint8)},
            {},
            r"log_ratio is not finite at a valid position: row 0, position 1",
        ),
        (
            {
                "log_ratio": np.zeros((1, 3), np.float32),
                "mask": np.ones((1, 3), np.uint8),
                "filtered_log_ratio": np.array([[0, 0, np.inf]], np.float32),
            },
            {},
            r"filtered_log_ratio is not finite at a valid position: row 0, position 2",
        ),
        (
            {"log_ratio": np.zeros((1, 3), np.float32), "mask": np.ones((1, 3), np.uint8)},
            {"q": "small"},
            r"metadata q='small' is not a number",
        ),
    ],
)
def test_bad_dumps_name_file_and_problem(tmp_path, tensors, meta, message):
    path = tmp_path / "step_000007.safetensors"
    save_file(tensors, str(path), metadata=meta)
    with pytest.raises(DumpError, match=message) as err:
        load_dump(path)
    assert str(path) in str(err.value)


def test_unreadable_and_unsupported_files(tmp_path):
    garbage = tmp_path / "broken.safetensors"
    garbage.write_bytes(b"not a safetensors file")
    with pytest.raises(DumpError, match=r"broken.safetensors: not a readable safetensors file"):
        load_dump(garbage)
    other = tmp_path / "ratios.pt"
    other.write_bytes(b"")
    with pytest.raises(DumpError, match=r"ratios.pt: unsupported file type '.pt'"):
        load_dump(other)


def test_command_reports_bad_dump_and_exits_2(tmp_path, capsys):
    path = tmp_path / "step_000001.safetensors"
    save_file({"log_ratio": np.zeros((1, 3), np.float32)}, str(path))
    assert main([str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "missing tensor 'mask'" in err
    with pytest.raises(SystemExit):
        main([])  # neither PATH nor --synthetic


def test_npz_without_filtered_is_refiltered_with_its_metadata(tmp_path):
    rng = np.random.default_rng(0)
    z = rng.normal(0, 0.2, size=(4, 30))
    m = np.ones((4, 30), dtype=bool)
    m[1, 20:] = False  # right padding
    m[2, 5:9] = False  # a hole
    z[3] = 0.0  # an on-policy row (all log-ratios exactly 0)
    np.savez(tmp_path / "d.npz", log_ratio=z, mask=m.astype(np.uint8), q=np.array("1e-4"), v=np.array("0.5"))
    dump = load_dump(tmp_path / "d.npz")
    assert dump.filtered is None and dump.meta == {"q": "1e-4", "v": "0.5"}
    cfg = AnalyzeConfig(sweep_q=(1e-3,))
    res = compute([dump], cfg).results
    filt = kalman_filter(torch.from_numpy(np.where(m, z, 0.0)), torch.from_numpy(m), q=1e-4, v=0.5).numpy()
    want = token_dynamics(filt, m, eps_low=3e-4, eps_high=4e-4)
    assert res["after"] == pytest.approx(want, rel=1e-12, nan_ok=True)
    assert res["before"] == pytest.approx(token_dynamics(z, m), rel=1e-12, nan_ok=True)
    files = res["inputs"]["files"]
    assert files[0]["filtered"] == "recomputed" and (files[0]["q"], files[0]["v"]) == (1e-4, 0.5)
    assert res["inputs"]["on_policy_rows"] == 1 and res["inputs"]["samples"] == 4
    # the paper's practice: leave the on-policy row out
    only = compute([dump], AnalyzeConfig(sweep_q=(1e-3,), off_policy_only=True)).results
    assert only["inputs"]["samples"] == 3
    assert only["before"] == pytest.approx(token_dynamics(z[:3], m[:3]), rel=1e-12, nan_ok=True)
    # the sweep refilters at each Q with V = 1
    sweep_filt = kalman_filter(
        torch.from_numpy(np.where(m, z, 0.0)), torch.from_numpy(m), q=1e-3, v=1.0
    ).numpy()
    row = res["sweep"]["rows"][0]
    assert row["q"] == 1e-3
    assert {k: row[k] for k in STAT_KEYS} == pytest.approx(
        token_dynamics(sweep_filt, m, eps_low=3e-4, eps_high=4e-4), rel=1e-12
    )


def test_refiltering_uses_the_dumps_initial_variance_and_state(tmp_path):
    # a run with p0/x0 set records them; re-filtering with the paper's 0, 0 instead would change every ratio
    rng = np.random.default_rng(1)
    z = rng.normal(0, 0.2, size=(3, 25))
    m = np.ones((3, 25), dtype=bool)
    meta = {"q": np.array("1e-4"), "v": np.array("1.0"), "p0": np.array("0.5"), "x0": np.array("0.01")}
    np.savez(tmp_path / "d.npz", log_ratio=z, mask=m.astype(np.uint8), **meta)
    res = compute([load_dump(tmp_path / "d.npz")], AnalyzeConfig(sweep_q=(1e-3,))).results
    zt, mt = torch.from_numpy(z), torch.from_numpy(m)
    filt = kalman_filter(zt, mt, q=1e-4, v=1.0, p0=0.5, x0=0.01).numpy()
    assert res["after"] == pytest.approx(token_dynamics(filt, m, eps_low=3e-4, eps_high=4e-4), rel=1e-12)
    paper = kalman_filter(zt, mt, q=1e-4, v=1.0).numpy()
    assert not np.allclose(filt, paper)
    # the Q/V sweep starts the filter where the run did too
    sweep = kalman_filter(zt, mt, q=1e-3, v=1.0, p0=0.5, x0=0.01).numpy()
    row = res["sweep"]["rows"][0]
    assert {k: row[k] for k in STAT_KEYS} == pytest.approx(
        token_dynamics(sweep, m, eps_low=3e-4, eps_high=4e-4), rel=1e-12, nan_ok=True
    )
    np.savez(tmp_path / "bad.npz", log_ratio=z, mask=m.astype(np.uint8), **{**meta, "p0": np.array("big")})
    with pytest.raises(DumpError, match="p0='big' is not a number"):
        load_dump(tmp_path / "bad.npz")


def test_on_policy_flag_in_metadata_beats_the_exact_zero_guess(tmp_path):
    # bf16 or re-batched old log-probs leave an on-policy step's log-ratios near, not exactly, 0: the trainer's
    # on_policy flag decides; a dump without it falls back to "all valid log-ratios exactly 0"
    rng = np.random.default_rng(2)
    z = rng.normal(0, 1e-4, size=(3, 10))
    m = np.ones((3, 10), dtype=bool)
    base = {"q": np.array("1e-4"), "v": np.array("1.0")}
    for flag, want in (("1", 3), ("0", 0)):
        np.savez(
            tmp_path / f"d{flag}.npz", log_ratio=z, mask=m.astype(np.uint8), on_policy=np.array(flag), **base
        )
        res = compute([load_dump(tmp_path / f"d{flag}.npz")], AnalyzeConfig(sweep_q=(1e-3,))).results
        assert res["inputs"]["on_policy_rows"] == want
    # an off-policy step whose row happens to have all log-ratios exactly 0 stays off-policy
    z[0] = 0.0
    np.savez(tmp_path / "d.npz", log_ratio=z, mask=m.astype(np.uint8), on_policy=np.array("0"), **base)
    res = compute([load_dump(tmp_path / "d.npz")], AnalyzeConfig(sweep_q=(1e-3,))).results
    assert res["inputs"]["on_policy_rows"] == 0
    np.savez(tmp_path / "bad.npz", log_ratio=z, mask=m.astype(np.uint8), on_policy=np.array("yes"), **base)
    with pytest.raises(DumpError, match="on_policy='yes' must be 0 or 1"):
        compute([load_dump(tmp_path / "bad.npz")], AnalyzeConfig(sweep_q=(1e-3,)))


def test_dumps_of_different_lengths_are_pooled(tmp_path):
    a = _dump(
        tmp_path / "step_000001.safetensors", [[0.1, 0.0, -0.1]], [[1, 1, 1]], [[0.01, 0.0, -0.01]], step=1
    )
    b = _dump(
        tmp_path / "step_000002.safetensors",
        [[0.0, 0.2, 0.2, 0.0, 0.5]],
        [[1, 1, 1, 1, 0]],
        [[0.0, 0.02, 0.02, 0.0, 0.0]],
        step=2,
    )
    res = compute([load_dump(a), load_dump(b)], AnalyzeConfig(sweep_q=(1e-6,))).results
    # row 0: up on down (switch 2/2); row 1: on up up on (switch 2/3) -> mean 5/6
    assert res["before"]["switch_freq"] == pytest.approx(5 / 6, abs=1e-12)
    assert [d["step"] for d in res["per_dump"]] == ["1", "2"]
    assert res["per_dump"][0]["before"]["switch_freq"] == pytest.approx(1.0)
    assert res["inputs"]["valid_tokens"] == 7


@pytest.mark.parametrize("sub", ["", "sub"])
def test_an_output_folder_blocked_by_a_file_is_a_clean_error(tmp_path, capsys, sub):
    # A file at --out (or above it) is one clear error, not a FileExistsError / NotADirectoryError traceback.
    file = tmp_path / "existing_file"
    file.write_text("")
    out = file / sub if sub else file
    assert main(["--synthetic", "--out", str(out), "--samples", "2", "--length", "8"]) == 2
    err = capsys.readouterr().err
    assert f"kpo analyze: error: output folder {str(out)!r}: {str(file)!r} is a file, not a folder" in err
    assert "Traceback" not in err and file.read_text() == ""


def test_figure1_draws_the_on_band_it_names():
    z = np.array([[0.01, -0.02, 0.0, 0.03]])
    m = np.ones_like(z, dtype=bool)
    fig = plots.traces(z, 0.1 * z, m, eps_low=3e-4, eps_high=4e-4, title="t")
    (band,) = fig.axes[1].patches  # the zoom panel's on band [1 - eps_low, 1 + eps_high]: asymmetric
    assert band.get_y() == pytest.approx(1 - 3e-4) and band.get_y() + band.get_height() == pytest.approx(
        1 + 4e-4
    )
    assert [ax.get_ylabel() for ax in fig.axes] == ["importance ratio", "importance ratio (zoom)"]


def test_figure1_frequency_band_is_one_std_clipped_to_0_1():
    # two windows: mean 0.5 with std 0.1, and mean 0.9 with std 0.3 (the band would reach 1.2: clipped to 1)
    w = {"mean": np.array([0.5, 0.9]), "var": np.array([0.01, 0.09]), "count": np.array([3, 3])}
    empty = {"mean": np.array([]), "var": np.array([]), "count": np.array([])}
    runs = {"up": np.array([1, 2, 2, 3]), "down": np.array([1]), "on": np.array([4, 4])}
    fig = plots.dynamics(
        window_before=w,
        window_after=empty,
        runs_before=runs,
        runs_after=runs,
        switch_before=np.array([0.2]),
        switch_after=np.array([0.1]),
        window=50,
    )
    (band,) = fig.axes[0].collections
    ys = np.round(band.get_paths()[0].vertices[:, 1], 9)
    assert set(ys) == {0.4, 0.6, 1.0}  # 0.5 -+ 0.1 and clip(0.9 -+ 0.3, 0, 1) = 0.6, 1.0
    # run lengths 1..4: integer ticks on a linear axis, not a log axis labelled "1" only
    assert fig.axes[1].get_xscale() == "linear"
    assert fig.axes[0].get_ylabel() == "off-policy share of the window's tokens"


def test_figure4_writes_q_over_v_in_one_notation_and_says_what_is_undefined():
    stats = dict.fromkeys(STAT_KEYS, 0.5)
    rows = [{"q_over_v": q, **stats} for q in (1e-6, 1e-4, 1.024e-3)]
    rows[1]["runlen_up"] = float("nan")  # no up run after filtering at 1e-4
    fig = plots.sweep({**stats, "lfr": float("nan")}, rows)
    panels = {ax.get_title(): ax for ax in fig.axes}
    assert [t.get_text() for t in panels["mean run length up"].get_xticklabels()] == [
        "1e-6",
        "1e-4",
        "1.024e-3",
    ]
    assert [t.get_text() for t in panels["mean run length up"].texts] == ["undefined at Q/V = 1e-4"]
    assert [t.get_text() for t in panels["low-frequency ratio"].texts] == ["before KF: undefined"]
    assert panels["mean run length up"].get_ylabel() == "tokens"


def test_write_dump_round_trips_through_load_dump(tmp_path):
    z = np.array([[0.1, -0.2, 0.0, 0.3], [0.05, 0.0, 0.0, 0.0]])
    m = np.array([[1, 1, 0, 1], [1, 0, 0, 0]], dtype=bool)  # a hole in row 0, padding in row 1
    settings = {"q": 1e-3, "v": 2.0, "p0": 0.5, "x0": 0.1, "mask_mode": "advance"}
    path = write_dump(
        tmp_path / "r" / "step_000007.safetensors",
        np.where(m, z, 0.0),
        m,
        step=7,
        settings=settings,
        loss="kpo",
        on_policy=False,
    )
    dump = load_dump(path)
    assert dump.meta == {
        "step": "7",
        "mask_mode": "advance",
        "q": "0.001",
        "v": "2.0",
        "p0": "0.5",
        "x0": "0.1",
        "loss": "kpo",
        "on_policy": "0",
    }
    np.testing.assert_array_equal(dump.mask, m)
    np.testing.assert_allclose(dump.log_ratio, np.where(m, z, 0.0).astype(np.float32))
    ref = kalman_filter(
        torch.from_numpy(np.where(m, z, 0.0).astype(np.float32).astype(np.float64)),
        torch.from_numpy(m),
        **settings,
    )
    np.testing.assert_allclose(dump.filtered[m], ref.numpy()[m], rtol=1e-6)
    with pytest.raises(ValueError, match=r"settings lack \['mask_mode'\]"):
        write_dump(tmp_path / "x.safetensors", z, m, step=1, settings={"q": 1, "v": 1, "p0": 0, "x0": 0})
    with pytest.raises(ValueError, match=r"log_ratio \(2, 4\) and mask \(1, 4\) must both be \[B, T\]"):
        write_dump(tmp_path / "x.safetensors", z, m[:1], step=1, settings=settings)


def test_a_dump_the_disk_has_no_room_for_is_absent_and_named(tmp_path, monkeypatch):
    """safetensors reports a full disk as its own error, the errno only in its text: write_dump names the dump in an
    OSError (one line from the command) and leaves no part of it where kpo analyze would read it."""
    import safetensors.numpy

    z, m = np.zeros((1, 4)), np.ones((1, 4), dtype=bool)
    settings = {"q": 1e-3, "v": 1.0, "p0": 0.0, "x0": 0.0, "mask_mode": "skip"}
    kept = write_dump(tmp_path / "ratios" / "step_000001.safetensors", z, m, step=1, settings=settings)

    def full_disk(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"{half a header")
        raise Exception("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.numpy, "save_file", full_disk)
    path = tmp_path / "ratios" / "step_000002.safetensors"
    with pytest.raises(OSError) as caught:
        write_dump(path, z, m, step=2, settings=settings)
    assert (caught.value.errno, caught.value.filename) == (28, str(path))
    assert find_dumps(tmp_path) == [kept] and sorted(p.name for p in kept.parent.iterdir()) == [kept.name]


def test_a_bad_setting_leaves_no_output_folder(tmp_path, capsys):
    """--synthetic wrote its dump before the analysis found the bad setting, leaving --out behind."""
    out = tmp_path / "X"
    assert main(["--synthetic", "--q", "-1", "--out", str(out), "--samples", "2", "--length", "8"]) == 2
    assert "q (process noise) must be > 0, got -1.0" in capsys.readouterr().err
    assert not out.exists()


def test_synthetic_settings_need_synthetic_and_a_size_that_fits(tmp_path, monkeypatch, capsys):
    """--samples/--length/--seed beside dump PATHs were ignored; --synthetic --samples 100000 --length 100000
    allocated 10^10 float64 tokens before anything was said."""
    import kpo.analysis.cli as cli

    def refuse(*args, **kwargs):
        raise AssertionError("the synthetic trace set was built")

    monkeypatch.setattr(cli, "write_synthetic", refuse)
    for flags in (["--samples", "8"], ["--seed", "1", "--length", "64"]):
        with pytest.raises(SystemExit) as e:
            main([str(tmp_path / "run"), *flags])
        assert e.value.code == 2
        given = ", ".join(f for f in flags if f.startswith("--"))
        assert f"error: {given} set the --synthetic trace set, and PATHs are analysed as they are" in (
            capsys.readouterr().err
        )
    with pytest.raises(SystemExit):
        main(["--synthetic", "--samples", "100000", "--length", "100000", "--out", str(tmp_path / "out")])
    assert "--samples 100000 x --length 100000: more than the 16777216 tokens" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
