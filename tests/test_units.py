from __future__ import annotations

import pytest

from advisor.core.errors import AdvisorInputError
from advisor.core.units import format_bytes, parse_budget


@pytest.mark.parametrize("text,expected,unit", [
    ("24GB", 24 * 2**30, "GiB"), ("24 GiB", 24 * 2**30, "GiB"), ("24000MiB", 24000 * 2**20, "MiB"),
    ("0.5TB", 2**39, "TiB"), ("25769803776", 24 * 2**30, "B"), ("24gb", 24 * 2**30, "GiB"),
])
def test_parse_sizes(text, expected, unit):
    b = parse_budget(text)
    assert b.bytes == expected and b.unit == unit


def test_a_24gb_card_is_expressible():
    # an RTX 4090 reports 24,564 MiB through NVML; "24GB" must be within it... and "100%" of it is exact
    assert parse_budget("100%", gpu_total_bytes=24564 * 2**20).bytes == 24564 * 2**20
    assert parse_budget("24GB").bytes == 24 * 2**30


def test_percent_needs_gpu():
    assert parse_budget("90%", gpu_total_bytes=80 * 2**30).bytes == int(72 * 2**30)
    with pytest.raises(AdvisorInputError, match="--gpu-budget.*--gpu"):
        parse_budget("90%")


@pytest.mark.parametrize("bad", ["24XB", "-5GB", "0", "0GB", "abc", "", "150%", "0%", "1KB"])
def test_bad_budgets(bad):
    with pytest.raises(AdvisorInputError) as e:
        parse_budget(bad, gpu_total_bytes=2**34)
    assert str(e.value).startswith("--gpu-budget:") and repr(bad) in str(e.value)


def test_printed_in_the_binary_unit_meant():
    """"24GB" means 24 GiB here (as nvidia-smi and PyTorch count), and prints so, beside the host's GiB."""
    b = parse_budget("24GB")
    assert str(b) == "24.00 GiB" and b.bytes == 24 * 2**30
    assert b.format(12 * 2**30) == "12.00 GiB"
    assert str(parse_budget("24000MB")) == "24,000.00 MiB" or str(parse_budget("24000MB")).endswith("MiB")
    assert format_bytes(1536 * 2**20) == "1.50 GiB"
