"""A full matrix and its representatives: the cases that run by default cover every value of every feature the
matrix varies (a model family, a lever, an optimizer, a workload...); the others are marked ``full_matrix`` and run
with ``--full-matrix`` (tests/conftest.py, docs/testing.md)."""

from __future__ import annotations

from typing import Any, Callable, Hashable, Iterable, Sequence

import pytest

FULL_MATRIX = pytest.mark.full_matrix


def representatives(cases: Sequence[Any], features: Callable[[Any], Iterable[Hashable]]) -> set[int]:
    """The indices of a small set of ``cases`` holding every feature value any case has (greedy set cover: the
    case adding the most values not yet held first, the earlier one on a tie)."""
    wanted = [set(features(c)) for c in cases]
    held: set[Hashable] = set()
    chosen: set[int] = set()
    while True:
        gain, best = max(((len(w - held), -i) for i, w in enumerate(wanted)), default=(0, 0))
        if gain == 0:
            return chosen
        chosen.add(-best)
        held |= wanted[-best]


def matrix_params(cases: Sequence[Any], features: Callable[[Any], Iterable[Hashable]],
                  ids: Callable[[Any], str] | None = None) -> list:
    """``cases`` as pytest parameters, those outside ``representatives`` marked ``full_matrix``. A case that is a
    tuple is passed as the test's several arguments."""
    keep = representatives(cases, features)
    out = []
    for i, case in enumerate(cases):
        values = case if isinstance(case, tuple) else (case,)
        out.append(pytest.param(*values, marks=() if i in keep else (FULL_MATRIX,),
                                id=ids(case) if ids else None))
    return out
