"""benchmarks/memory_vs_published.py: every published point is predicted or listed with its reason."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("memory_vs_published", ROOT / "benchmarks" / "memory_vs_published.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    if not mod.DEFAULT_DATA.exists():
        pytest.skip("published_runs/memory.json is not beside this checkout")
    return mod


def test_every_point_is_predicted_or_has_a_reason(bench):
    points = json.loads(bench.DEFAULT_DATA.read_text())
    rows, skipped, _ = bench.run(bench.DEFAULT_DATA, "estimate")
    assert len(rows) + len(skipped) == len(points)
    assert not [pid for pid, why in skipped if why == "not mapped"]
    ids = {p["id"] for p in points}
    assert set(bench.CASES) <= ids and set(bench.GEN_CASES) <= ids  # no case for a point that is not there
    for r in rows:
        assert r.predicted > 0 and r.published > 0
        assert set(r.phases.split("+")) <= {"load", "train", "eval", "generate", "save"}
    # the stacks are reported apart: the advisor's own (transformers) and the others
    assert {r.stack for r in rows} == {bench.HF, bench.LITGPT, bench.TORCHTUNE}


def test_the_report_lists_every_row_and_reason(bench, tmp_path):
    out = tmp_path / "r.md"
    assert bench.main(["--backend", "estimate", "--out", str(out)]) == 0
    text = out.read_text()
    rows, skipped, _ = bench.run(bench.DEFAULT_DATA, "estimate")
    assert all(f"| {r.id} |" in text for r in rows) and all(f"| {pid} |" in text for pid, _ in skipped)
    assert "What litgpt does differently" in text and "What torchtune does differently" in text


def test_preflights_error_band_is_the_estimate_backends_measured_one(bench):
    """advisor/data/prediction_error.yaml (what `advisor preflight` warns with) holds the estimate backend's most
    under and most over on the transformers rows, as this benchmark computes them now."""
    from advisor.core.catalog import _load_data

    rows, _, _ = bench.run(bench.DEFAULT_DATA, "estimate")
    hf = [r for r in rows if r.stack == bench.HF]
    band = _load_data("prediction_error.yaml")["estimated"]
    worst = min(hf, key=lambda r: r.error)
    assert band["points"] == len(hf) and band["worst_under_point"] == worst.id
    assert band["most_under"] == pytest.approx(worst.error, abs=0.0005)
    assert band["most_over"] == pytest.approx(max(r.error for r in hf), abs=0.0005)


def test_the_auto_section_is_rendered_from_its_rows(bench):
    """--auto-section appends the auto backend's rows, a table and a summary per stack, generated, not written by hand."""
    GiB = 2**30
    rows = [bench.Row("qwen-a", bench.HF, "nvidia-smi", "load+train", 10 * GiB, 9 * GiB, "train", "B", (), "simulate"),
            bench.Row("torchtune-b", bench.TORCHTUNE, "reserved", "train", 10 * GiB, 10.2 * GiB, "train", "A", (),
                      "simulate")]
    text = bench.render_auto_section(rows, ["qwen-", "torchtune-"])
    assert "--auto-section qwen- torchtune-" in text
    assert "transformers: 1 points: median abs. error 10.0%, worst 10.0%, most under -10.0%, within 3%: 0/1." in text
    assert "| qwen-a | B | nvidia-smi | load+train | 10.00 GiB | 9.00 GiB | -10.0% | train | simulate |  |" in text
    assert "| torchtune-b |" in text and "litgpt:" not in text
