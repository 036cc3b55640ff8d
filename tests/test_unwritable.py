"""A folder the command cannot write (a read-only mount) is a one-line error naming it, never a traceback, and
what was there before stays as it was."""

from __future__ import annotations

import errno
import os
import pathlib

import pytest

from advisor.cli import main


@pytest.fixture
def read_only(tmp_path, monkeypatch):
    """``tmp_path/ro`` behaves as a read-only mount: creating anything under it raises EROFS (root ignores file
    modes, so the mount is stood in for at the calls that create files and folders)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    real_mkdir, real_open, real_os_open = pathlib.Path.mkdir, open, os.open

    def under(path) -> bool:
        try:
            return pathlib.Path(os.fspath(path)).resolve().is_relative_to(ro.resolve())
        except TypeError:
            return False

    def mkdir(self, *a, **k):
        if under(self) and not self.exists():
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real_mkdir(self, *a, **k)

    def os_open(path, flags, *a, **k):
        if under(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", os.fspath(path))
        return real_os_open(path, flags, *a, **k)

    def builtin_open(file, mode="r", *a, **k):
        if under(file) and any(c in mode for c in "wax+"):
            raise OSError(errno.EROFS, "Read-only file system", os.fspath(file))
        return real_open(file, mode, *a, **k)

    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr("builtins.open", builtin_open)
    return ro


def test_tune_in_a_read_only_reports_dir_is_one_line(read_only, capsys):
    code = main(["tune", "--gpu-budget", "24GB", "--model", "qwen0.5b", "--backend", "estimate", "--trials", "2",
                 "--reports-dir", str(read_only)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "Read-only file system" in err
    assert list(read_only.iterdir()) == []


def test_export_to_a_read_only_folder_is_one_line(read_only, tmp_path, capsys):
    reports = tmp_path / "reports"
    assert main(["tune", "--gpu-budget", "24GB", "--model", "qwen0.5b", "--backend", "estimate", "--trials", "2",
                 "--reports-dir", str(reports)]) == 0
    study = next(reports.iterdir())
    before = {p: p.read_bytes() for p in study.rglob("*") if p.is_file()}
    capsys.readouterr()
    code = main(["export", study.name, "--reports-dir", str(reports), "--out", str(read_only / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--out" in err, err
    assert {p: p.read_bytes() for p in study.rglob("*") if p.is_file()} == before


def test_a_reports_dir_it_cannot_write_names_reports_dir_not_storage(tmp_path, capsys, monkeypatch):
    """A folder that exists but cannot be written (a read-only mount; root ignores file modes, so os.access stands
    in): the study's folder is the error, named by the flag that placed it (issue 41)."""
    import advisor.core.errors as errors

    reports = tmp_path / "reports"
    reports.mkdir()
    real = os.access
    monkeypatch.setattr(errors.os, "access",
                        lambda p, mode: False if str(p).startswith(str(reports)) else real(p, mode))
    code = main(["tune", "--gpu-budget", "24GB", "--model", "qwen0.5b", "--backend", "estimate", "--trials", "2",
                 "--reports-dir", str(reports)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--reports-dir" in err and "--storage" not in err and "Permission denied" in err


def test_an_export_folder_it_cannot_write_is_refused_before_the_study_runs(tmp_path, capsys, monkeypatch):
    import advisor.core.errors as errors

    out = tmp_path / "out"
    real = os.access
    monkeypatch.setattr(errors.os, "access", lambda p, mode: False if str(p).startswith(str(out)) else real(p, mode))
    code = main(["tune", "--gpu-budget", "24GB", "--model", "qwen0.5b", "--backend", "estimate", "--trials", "2",
                 "--reports-dir", str(tmp_path / "reports"), "--export", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--export" in err, err
    assert not (tmp_path / "reports").exists()  # no study was run (nor its folder made)
