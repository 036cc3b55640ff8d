"""benchmarks/vlm_vs_published.py: every expressed point is in the published file and names a catalogued model."""

from __future__ import annotations

import json

import pytest
from benchmark_modules import load_benchmark  # tests/benchmark_modules.py


@pytest.fixture(scope="module")
def bench():
    mod = load_benchmark("vlm_vs_published")
    if not mod.DATA.exists():
        pytest.skip("published_runs/vlm_longctx_runs.json is not beside this checkout")
    return mod


def test_expressed_points_exist_and_their_models_resolve(bench):
    from advisor.core.catalog import resolve_gpu, resolve_model
    from advisor.core.plan import Plan

    points = {p["id"]: p for p in json.loads(bench.DATA.read_text())["vlm"]}
    mapped = {**bench.EXPRESSED, **bench.REFERENCE}
    assert set(mapped) <= set(points), sorted(set(mapped) - set(points))
    assert not set(bench.EXPRESSED) & set(bench.REFERENCE)  # a point is compared or shown for reference, not both
    assert not set(bench.WHY_NOT) & set(bench.EXPRESSED)  # an expressed point has no reason for not being one
    for pid, spec in mapped.items():
        model = resolve_model(spec["model"])
        assert model.vision is not None, f"{pid}: {spec['model']} is not a vision-language model"
        resolve_gpu(spec["gpu"])
        assert spec["counter"] in ("swift", "fits") and spec["samples"]
        Plan(**spec["plan"])  # the fields are the Plan's
        published_bytes, _ = bench.published(points[pid])
        assert (published_bytes is not None) == (spec["counter"] == "swift"), pid
