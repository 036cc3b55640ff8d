"""benchmarks/long_context_vs_published.py: every mapped point is in the published file, names a model that
resolves and fields of the Plan; the committed report lists every point of the file (none silently dropped)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from benchmark_modules import load_benchmark  # tests/benchmark_modules.py

REPORT = Path(__file__).resolve().parents[1] / "reports" / "long_context_vs_published.md"


@pytest.fixture(scope="module")
def bench():
    mod = load_benchmark("long_context_vs_published")
    if not mod.DATA.exists():
        pytest.skip("published_runs/vlm_longctx_runs.json is not beside this checkout")
    return mod


@pytest.fixture(scope="module")
def points(bench):
    return {p["id"]: p for p in json.loads(bench.DATA.read_text())["long_context"]}


def test_expressed_points_exist_and_their_models_resolve(bench, points):
    from advisor.core.catalog import resolve_gpu
    from advisor.core.plan import Plan

    assert set(bench.EXPRESSED) <= set(points), sorted(set(bench.EXPRESSED) - set(points))
    for pid, spec in bench.EXPRESSED.items():
        bench.model_of(spec["model"])  # a catalog model, or memory_vs_published's ARCH config
        resolve_gpu(spec["gpu"])
        assert spec["counter"] in ("unstated", "swift"), pid
        Plan(**spec["plan"]).validate()
        published_bytes, _ = bench.published(points[pid])
        assert published_bytes is not None, f"{pid}: a compared point needs a published figure"


def test_bounds_and_references_name_points_of_the_file(bench, points):
    from advisor.core.catalog import resolve_gpu
    from advisor.core.plan import Plan

    for label, spec in bench.BOUNDS.items():
        assert spec["ids"] and set(spec["ids"]) <= set(points), label
        bench.model_of(spec["model"])
        resolve_gpu(spec["gpu"])
        Plan(**{**spec["plan"], "seq_len": 1024}).validate()
        assert spec["fit"] is not None or spec["oom"] is not None, label
    mapped = set(bench.EXPRESSED) | {i for s in bench.BOUNDS.values() for i in s["ids"]}
    assert set(bench.REFERENCE) | set(bench.REFERENCE_BOUNDS) <= set(points)
    assert not (set(bench.REFERENCE) | set(bench.REFERENCE_BOUNDS)) & mapped  # a reference is not a comparison
    assert set(bench.WHY_NOT) <= set(points)
    assert not set(bench.WHY_NOT) & mapped  # a compared point has no reason for not being one
    assert mapped | set(bench.WHY_NOT) == set(points), sorted(set(points) - mapped - set(bench.WHY_NOT))


def test_report_lists_every_point(points):
    if not REPORT.exists():
        pytest.skip("reports/long_context_vs_published.md not generated")
    text = REPORT.read_text(encoding="utf-8")
    missing = [pid for pid in points if not re.search(rf"(?<![\w.-]){re.escape(pid)}(?![\w.-])", text)]
    assert not missing, missing
