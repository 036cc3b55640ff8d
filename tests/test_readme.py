"""The README stays short: at most 160 lines, none over 120 characters."""

from pathlib import Path


def test_the_readme_is_short():
    lines = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 160, len(lines)
    long = [i for i, line in enumerate(lines, 1) if len(line) > 120]
    assert not long, f"lines over 120 characters: {long}"
