"""Every shipped search space loads and validates; broken ones report every error with its key."""

from __future__ import annotations

import pytest

from advisor.core.catalog import resolve_model
from advisor.core.errors import AdvisorInputError, ConfigErrors
from advisor.search.space import SPACES_DIR, list_spaces, load_space, plan_from_params


def test_required_spaces_exist():
    assert {"default", "qlora", "throughput", "low-memory"} <= set(list_spaces())


@pytest.mark.parametrize("name", list_spaces())
def test_space_loads_and_every_grid_point_builds_a_plan(name):
    space = load_space(name)
    text = (SPACES_DIR / f"{name}.yaml").read_text()
    assert text.startswith("#") and "advisor tune" in text.split("name:")[0], "header: purpose and how to run it"
    arch = resolve_model("qwen7b").arch
    points = list(space.grid())
    assert points
    valid = [p for p in points if not plan_from_params(p, space, arch).problems()]
    assert valid, "a space whose every plan is invalid"


def test_overrides_pin_and_set():
    s = load_space("default", ["method=qlora", "seq_len=2048", "micro_batch=[1,2]"])
    assert s.search["method"] == ["qlora"] and s.fixed["seq_len"] == 2048 and s.search["micro_batch"] == [1, 2]


def test_all_errors_at_once(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ntrials: 0\nfixed: {seq_len: 0, global_batch: 8, lora_dropout: 2, lora_alpha_ratio: 2}\n"
                   "search:\n  method: [qlora, sideways]\n  quantization: [nf4]\n  double_quant: [true]\n"
                   "  lora_r: [0]\n  lora_targets: [attention]\n  gradient_checkpointing: [true]\n"
                   "  optimizer: [adamw_torch]\n  micro_batch: [1]\n  precision: [bf16]\n  attn_impl: [sdpa]\n"
                   "  offload: [none]\n  chunked_ce: [false]\n  warp_drive: [on]\n")
    with pytest.raises(ConfigErrors) as e:
        load_space(str(bad))
    where = {err.where for err in e.value.errors}
    assert {"trials", "fixed.seq_len", "fixed.lora_dropout", "search.method", "search.lora_r",
            "search.warp_drive"} <= where


def test_missing_space_and_broken_yaml(tmp_path):
    with pytest.raises(AdvisorInputError, match="--space"):
        load_space("no-such-space")
    broken = tmp_path / "broken.yaml"
    broken.write_text("search: [unclosed\n")
    with pytest.raises(AdvisorInputError, match="not valid YAML"):
        load_space(str(broken))


def test_unknown_override_key():
    with pytest.raises(AdvisorInputError, match="unknown key"):
        load_space("default", ["warp=9"])
