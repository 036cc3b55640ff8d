"""The wheel works: built from the repository, installed into a fresh virtual environment outside it,
the installed copy (not the checkout) finds every file it reads: the search spaces, the catalogs, the
probe texts. Runs the main job with the estimate backend and a CPU probe of the tiny model there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _run(cmd, cwd, env, timeout=600):
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    base = tmp_path_factory.mktemp("wheel")
    # build from a copy: an in-tree build would leave build/ and *.egg-info in the checkout
    src = base / "src"
    shutil.copytree(ROOT / "advisor", src / "advisor", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", base / "dist", src],
         cwd=base, env=env)
    wheel = next((base / "dist").glob("vram_advisor-*.whl"))
    env_dir = base / "venv"
    # --without-pip: no ensurepip needed (Debian ships it apart); the system pip, seen through the system
    # site-packages, installs into the venv it runs in
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", env_dir], cwd=base, env=env)
    py = env_dir / "bin" / "python"
    _run([py, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel], cwd=base, env=env)
    work = base / "elsewhere"  # not the repository: nothing can be found relative to the checkout
    work.mkdir()
    return {"wheel": wheel, "dir": env_dir, "py": py, "advisor": env_dir / "bin" / "advisor", "cwd": work, "env": env}


def test_wheel_holds_the_data_files(venv):
    names = zipfile.ZipFile(venv["wheel"]).namelist()
    for needed in ("advisor/data/spaces/default.yaml", "advisor/data/spaces/inference.yaml",
                   "advisor/data/models.yaml", "advisor/data/gpus.yaml"):
        assert needed in names, needed
    assert any(n.startswith("advisor/data/probes/eval/") and n.endswith(".txt") for n in names)
    assert any(n.startswith("advisor/data/probes/train/") and n.endswith(".txt") for n in names)


def test_installed_copy_is_the_one_imported(venv):
    out = _run([venv["py"], "-c", "import advisor, sys; print(advisor.__file__)"], venv["cwd"], venv["env"])
    path = Path(out.strip()).resolve()
    assert venv["dir"].resolve() in path.parents, path
    assert ROOT not in path.parents


def test_tune_with_the_estimate_backend_from_the_wheel(venv):
    out = _run([venv["advisor"], "tune", "--backend", "estimate", "--gpu-budget", "24GB", "--model", "qwen7b",
                "--json", "--trials", "12", "--reports-dir", venv["cwd"] / "reports"], venv["cwd"], venv["env"])
    d = json.loads(out)
    assert d["n_trials"] == 12 and d["best"]["plan"]["method"] in ("lora", "qlora")
    import optuna

    study = optuna.load_study(study_name=d["study"], storage=d["storage"])
    space = study.user_attrs["advisor"]["space"]
    assert space["name"] == "default"
    assert Path(space["source"]).resolve().is_relative_to(venv["dir"].resolve()), space["source"]


def test_cpu_probe_of_the_tiny_model_from_the_wheel(venv):
    # the tiny model trains on the probe texts shipped in the wheel; the probe's default eval set is shipped too
    model = _run([venv["py"], "-c", "from advisor.runtime.probe._tiny import tiny_model_dir; print(tiny_model_dir())"],
                 venv["cwd"], venv["env"]).strip().splitlines()[-1]
    out = _run([venv["advisor"], "probe", "--model", model, "--device", "cpu", "--method", "lora", "--seq-len", "32",
                "--steps", "1", "--warmup", "1", "--weights", model, "--json"], venv["cwd"], venv["env"])
    r = json.loads(out)
    assert r["status"] == "ok" and r["device"] == "cpu" and r["tokens_per_s"] > 0
    assert r["fidelity_tokens"] > 0  # the eval texts shipped in the wheel were read
