"""A traced step kept on disk (advisor/runtime/simulate/disk_cache.py): the same question is answered once per folder,
a changed question or code is traced again, an unreadable file is traced again, and without the folder nothing is
kept."""

from __future__ import annotations

import pickle

from advisor.runtime.simulate import disk_cache


def _counting():
    calls = []

    def compute():
        calls.append(1)
        return {"peak_bytes": 100 + len(calls)}

    return calls, compute


def test_the_same_question_is_traced_once_per_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(disk_cache.ENV, str(tmp_path / "sims"))
    calls, compute = _counting()
    first = disk_cache.kept(lambda: {"model": "m", "plan": {"seq_len": 64}}, compute)
    # the same question, its keys reordered
    again = disk_cache.kept(lambda: {"plan": {"seq_len": 64}, "model": "m"}, compute)
    other = disk_cache.kept(lambda: {"model": "m", "plan": {"seq_len": 128}}, compute)
    assert first == again == {"peak_bytes": 101} and other == {"peak_bytes": 102} and len(calls) == 2
    assert len(list((tmp_path / "sims").glob("*.pickle"))) == 2 and not list((tmp_path / "sims").glob("*.partial"))


def test_other_code_is_another_key(tmp_path, monkeypatch):
    monkeypatch.setenv(disk_cache.ENV, str(tmp_path))
    calls, compute = _counting()
    disk_cache.kept(lambda: {"q": 1}, compute)
    monkeypatch.setattr(disk_cache, "code_fingerprint", lambda: "another version of the code")
    disk_cache.kept(lambda: {"q": 1}, compute)
    assert len(calls) == 2


def test_an_unreadable_file_is_traced_again_and_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv(disk_cache.ENV, str(tmp_path))
    calls, compute = _counting()
    disk_cache.kept(lambda: {"q": 1}, compute)
    [path] = tmp_path.glob("*.pickle")
    path.write_bytes(b"half a pick")
    assert disk_cache.kept(lambda: {"q": 1}, compute) == {"peak_bytes": 102}
    assert pickle.loads(path.read_bytes()) == {"peak_bytes": 102}


def test_without_the_folder_nothing_is_kept_and_no_question_is_asked(tmp_path, monkeypatch):
    monkeypatch.delenv(disk_cache.ENV, raising=False)
    calls, compute = _counting()

    def question():
        raise AssertionError("the question was built without a folder to keep the answer in")

    disk_cache.kept(question, compute)
    disk_cache.kept(question, compute)
    assert len(calls) == 2


def test_the_fingerprint_covers_the_packages_code_and_the_traced_libraries():
    assert "torch" in disk_cache.TRACED_LIBRARIES and "transformers" in disk_cache.TRACED_LIBRARIES
    assert disk_cache.code_fingerprint() == disk_cache.code_fingerprint() and len(disk_cache.code_fingerprint()) == 64
