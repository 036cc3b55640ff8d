"""A full matrix and its representatives: the cases that run by default cover every value of every feature the
matrix varies (a model family, a lever, an optimizer, a workload...); the others are marked ``full_matrix`` and run
with ``--full-matrix`` (tests/conftest.py, docs/testing.md)."""

from __future__ import annotations

from typing import Any, Callable, Hashable, Iterable, Sequence

import pytest

MARK = "full_matrix"
FULL_MATRIX = getattr(pytest.mark, MARK)


def representatives(cases: Sequence[Any], features: Callable[[Any], Iterable[Hashable]],
                    chosen: Iterable[int] = ()) -> set[int]:
    """The indices of a small set of ``cases`` holding every feature value any case has (greedy set cover from the
    ``chosen`` ones: the case adding the most values not yet held first, the earlier one on a tie)."""
    wanted = [set(features(c)) for c in cases]
    chosen = set(chosen)
    held: set[Hashable] = set().union(*(wanted[i] for i in chosen))
    while True:
        gain, best = max(((len(w - held), -i) for i, w in enumerate(wanted)), default=(0, 0))
        if gain == 0:
            return chosen
        chosen.add(-best)
        held |= wanted[-best]


def matrix_params(cases: Sequence[Any], features: Callable[[Any], Iterable[Hashable]],
                  ids: Callable[[Any], str] | None = None, slow: Callable[[Any], bool] | None = None) -> list:
    """``cases`` as pytest parameters, those outside ``representatives`` marked ``full_matrix`` (and those ``slow``
    says marked slow; the others always run). A case that is a tuple is passed as the test's several arguments."""
    keep = representatives(cases, features, [i for i, c in enumerate(cases) if slow and not slow(c)])
    out = []
    for i, case in enumerate(cases):
        values = case if isinstance(case, tuple) else (case,)
        marks = ([] if i in keep else [FULL_MATRIX]) + ([pytest.mark.slow] if slow and slow(case) else [])
        out.append(pytest.param(*values, marks=marks, id=ids(case) if ids else None))
    return out
