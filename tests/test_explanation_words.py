"""The explanation's words: no "-0%", no empty list of changes."""

from __future__ import annotations

from advisor.search.select import signed_pct


def test_a_change_that_rounds_to_nothing_is_zero_percent():
    assert signed_pct(-0.003) == "0%" and signed_pct(0.004) == "0%"
    assert signed_pct(0.16) == "+16%" and signed_pct(-0.05) == "-5%"
