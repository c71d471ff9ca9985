"""kpo._files: whole-or-absent writes, torn log tails, and file-system faults as one line."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from kpo._files import complete_part, file_fault, replacing, writing


def test_replacing_a_file_leaves_the_old_one_until_the_new_one_is_whole(tmp_path):
    path = tmp_path / "a" / "results.json"
    with replacing(path) as partial:
        partial.write_text("old")
    with pytest.raises(RuntimeError), replacing(path) as partial:
        partial.write_text("half of the n")
        assert path.read_text() == "old"  # readers see the old one while the new one is written
        raise RuntimeError("killed")
    assert path.read_text() == "old" and sorted(p.name for p in path.parent.iterdir()) == ["results.json"]


def test_what_a_kill_left_aside_is_cleared_by_the_next_write(tmp_path):
    path = tmp_path / "config.yaml"
    (tmp_path / ".config.yaml.partial").write_text("cut")
    with replacing(path) as partial:
        assert not partial.exists()
        partial.write_text("whole")
    assert path.read_text() == "whole" and [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_replacing_a_folder_keeps_none_of_the_old_ones_files(tmp_path):
    folder = tmp_path / "final"
    for files in ({"model": "1", "stale": "x"}, {"model": "2"}):
        with replacing(folder) as partial:
            partial.mkdir()
            for name, text in files.items():
                (partial / name).write_text(text)
    assert {p.name: p.read_text() for p in folder.iterdir()} == {"model": "2"}
    assert [p.name for p in tmp_path.iterdir()] == ["final"]


def test_a_folder_is_swapped_in_without_a_moment_with_none(tmp_path, monkeypatch):
    """Where renameat2(RENAME_EXCHANGE) exists (Linux), the new folder and the old trade places in one step: a
    reader never finds no folder. A kill at the instant of the swap is simulated by failing the two-step
    fallback's renames: they must not run at all."""
    from kpo import _files

    folder = tmp_path / "final"
    with replacing(folder) as partial:
        partial.mkdir()
        (partial / "model").write_text("1")
    if _files._renameat2() is None:
        pytest.skip("this C library has no renameat2: the two-step swap (docstring) applies")
    monkeypatch.setattr(Path, "rename", lambda *a: pytest.fail("the folder went aside: a window with no folder"))
    with replacing(folder) as partial:
        partial.mkdir()
        (partial / "model").write_text("2")
    assert (folder / "model").read_text() == "2" and [p.name for p in tmp_path.iterdir()] == ["final"]


def test_complete_part_drops_a_torn_last_line():
    assert complete_part(b'{"step": 1}\n{"step": 2}\n{"st') == b'{"step": 1}\n{"step": 2}\n'
    assert complete_part(b'{"step": 1}\n') == b'{"step": 1}\n'
    assert complete_part(b'{"st') == b""


def test_a_fault_without_a_path_is_given_the_one_being_written(tmp_path):
    """Python's own write errors carry no file name (the file is already open); safetensors names the errno in its
    text (Rust's "os error N")."""
    where = tmp_path / "metrics.jsonl"
    for raised in (OSError(errno.ENOSPC, "No space left on device"), Exception("I/O error (os error 28)")):
        with pytest.raises(OSError) as caught, writing(where):
            raise raised
        assert (caught.value.errno, caught.value.filename) == (errno.ENOSPC, str(where))
        assert file_fault(caught.value) == (
            f"{where}: no space left on the device; free space there or write elsewhere",
            74,
        )


def test_an_error_the_file_system_does_not_explain_is_left_as_it_came(tmp_path):
    """A probe write succeeds beside it: a bug, not a fault (and the probe leaves nothing)."""
    with pytest.raises(ValueError, match="a bug"), writing(tmp_path / "x"):
        raise ValueError("a bug")
    assert not any(tmp_path.iterdir())
    assert file_fault(ValueError("a bug")) is None and file_fault(OSError(errno.EIO, "I/O error")) is None
