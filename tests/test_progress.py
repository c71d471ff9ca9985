"""Progress outside a terminal is lines, never tqdm's carriage-return stream (kpo._progress)."""

from __future__ import annotations

import io

from kpo._progress import LineBar, progress_bar


def test_a_log_gets_a_line_per_tenth_and_the_last():
    log = io.StringIO()  # not a terminal
    assert isinstance(progress_bar(25, "generate synthetic", "samples", stream=io.StringIO()), LineBar)
    bar = LineBar(25, "generate synthetic", "samples", log, min_seconds=0.0)
    for _ in range(
        5
    ):  # 5 batches of 5: the count passes 3, 6, 9, ... (tenths of 25, rounded up) once a batch
        bar.set_postfix(tok_per_s=100)
        bar.update(5)
    bar.close()
    bar.update(1)  # after close: nothing more
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    counts = [line.split(": ", 1)[1].split(" ", 1)[0] for line in lines]
    assert counts == ["0/25", "5/25", "10/25", "15/25", "20/25", "25/25"]
    assert lines[0].startswith("generate synthetic: 0/25 samples (0%), 0:00 elapsed")
    assert lines[-1].startswith("generate synthetic: 25/25 samples (100%)") and lines[-1].endswith(
        "tok_per_s=100"
    )


def test_a_long_bar_prints_about_ten_lines_and_a_fast_one_two():
    log = io.StringIO()
    with LineBar(1000, "grade", "problems", log, min_seconds=0.0) as bar:
        for _ in range(1000):
            bar.update()
    assert len(log.getvalue().splitlines()) == 11  # 0, 100, ..., 1000
    fast = io.StringIO()
    with progress_bar(1000, "grade", "problems", stream=fast) as bar:  # done within a second
        for _ in range(1000):
            bar.update()
    assert [line.split(" ")[1] for line in fast.getvalue().splitlines()] == ["0/1000", "1000/1000"]


def test_progress_off_prints_nothing_but_messages(capsys):
    log = io.StringIO()
    bar = progress_bar(4, "compare", "steps", enabled=False, stream=log)
    bar.update(4)
    bar.write("done vanilla-seed0")
    assert log.getvalue() == "" and capsys.readouterr().out == "done vanilla-seed0\n"
