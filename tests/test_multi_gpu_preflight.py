"""Issue 42, items 1 and 2: pre-flight checks a several-GPU export as the run it is (one GPU's share of the model
state its sharding splits, the node's host memory for all its ranks), and tune's default host budget for --gpus N
is the node those ranks share, as estimate's is."""

from __future__ import annotations

import json

import pytest

from advisor.cli import main
from advisor.configs.export import export_plan
from advisor.core.catalog import resolve_gpu, resolve_model
from advisor.core.plan import Plan
from advisor.runtime.phases import run_report

pytestmark = pytest.mark.slow  # a 70B's export checked three times, a 4-trial tune: 9 s

PLAN = Plan(method="lora", gradient_checkpointing=True, micro_batch=8, expandable_segments=True)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("zero3-70b")
    model, gpu = resolve_model("llama70b"), resolve_gpu("h100-sxm")
    export_plan(model, PLAN, out, ["advisor", "deepspeed", "axolotl"], gpu=gpu, gpus=8, sharding="zero3")
    return out, run_report(model, PLAN, gpu, gpus=8, sharding="zero3").run_peak_bytes


def _preflight(capsys, path, *extra) -> tuple[int, dict]:
    code = main(["preflight", str(path), "--gpu", "h100-sxm", "--gpu-budget", "80GB", "--backend", "estimate",
                 "--json", *extra])
    return code, {f["check"]: f for f in json.loads(capsys.readouterr().out)["findings"]}


def test_the_exports_own_sharding_is_checked(exported, capsys):
    """advisor.yaml says its GPUs and sharding: one GPU's share is checked (was NO-GO, "weights 131.42 GiB")."""
    out, peak = exported
    code, found = _preflight(capsys, out / "advisor.yaml")
    assert code == 0 and found["memory.fit"]["data"]["peak_bytes"] == peak
    assert found["config.layout"]["data"] == {"gpus": 8, "sharding": "zero3"}
    # the node's host memory for the 8 ranks, against the node the card is planned on (not "detected")
    host = found["env.host-ram"]
    assert host["data"]["host_budget_bytes"] == 2048 * 2**30 and "detected" not in host["title"]


def test_a_file_without_a_gpu_count_is_checked_as_one_gpu_and_says_so(exported, capsys):
    out, peak = exported
    code, found = _preflight(capsys, out / "axolotl.yaml")
    assert code == 1 and found["config.layout"]["severity"] == "warning"  # the whole 70B on one GPU: NO-GO
    assert found["memory.fit"]["severity"] == "error"
    code, found = _preflight(capsys, out / "axolotl.yaml", "--gpus", "8")
    assert found["config.layout"]["data"] == {"gpus": 8, "sharding": "zero3"}
    assert found["memory.fit"]["severity"] in ("ok", "warning")


def test_tunes_default_host_budget_is_the_node_its_ranks_share(tmp_path, capsys):
    """`tune --gpus 8 --gpu h100-sxm` held 8 ranks' host memory to 1/8 of the node (256 GiB)."""
    code = main(["tune", "--model", "llama70b", "--gpus", "8", "--gpu", "h100-sxm", "--gpu-budget", "80GB",
                 "--method", "full", "--offload", "zero3_cpu", "--backend", "estimate", "--trials", "4", "--json",
                 "--reports-dir", str(tmp_path)])
    d = json.loads(capsys.readouterr().out)
    assert d["host_budget"]["bytes"] == 2048 * 2**30, d["host_budget"]
    assert code == 0 and d["best"] is not None
