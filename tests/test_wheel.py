"""The wheel works: built from the repository, installed into a fresh virtual environment outside it,
the installed copy (not the checkout) finds every file it reads: the search spaces, the catalogs, the
probe texts. Runs the main job with the estimate backend and a CPU probe of the tiny model there.

The environment is made here and sees only the wheel and the distributions the wheel's metadata
requires (transitively). Those come from the installation that runs the suite, linked rather than
downloaded: torch and transformers are gigabytes, and the test must run offline in seconds. Nothing
else of that installation is visible (not this checkout's editable install, not pytest, not the
optional extras), so a module the wheel imports but does not declare fails here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _run(cmd, cwd, env, timeout=600):
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _required_distributions(wheel: Path) -> list[metadata.Distribution]:
    """The installed distributions the wheel's Requires-Dist names, and theirs, extras followed."""
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    todo = [(Requirement(line.split(":", 1)[1].strip()), "") for line in meta.splitlines()
            if line.startswith("Requires-Dist:")]
    found: dict[str, metadata.Distribution] = {}
    seen = set()
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        key = (req.name.lower().replace("_", "-"), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        dist = metadata.distribution(req.name)  # the one this interpreter imports; not installed: the test fails
        assert req.specifier.contains(dist.version, prereleases=True), f"{req} is required, {dist.version} installed"
        found[dist.metadata["Name"]] = dist
        for extra_name in ("", *req.extras):
            todo += [(Requirement(r), extra_name) for r in dist.requires or []]
    return list(found.values())


def _link_distributions(dists, into: Path) -> None:
    """Links each distribution's top-level files (packages, modules, .dist-info, .libs) into one folder."""
    into.mkdir()
    for dist in dists:
        assert dist.files is not None, f"{dist.metadata['Name']} has no RECORD: cannot tell its files"
        for top in {f.parts[0] for f in dist.files if f.parts[0] not in ("..", "__pycache__")}:
            target = Path(dist.locate_file(top))
            if target.exists() and not (into / top).exists():
                (into / top).symlink_to(target)


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    base = tmp_path_factory.mktemp("wheel")
    # build from a copy: an in-tree build would leave build/ and *.egg-info in the checkout
    src = base / "src"
    shutil.copytree(ROOT / "advisor", src / "advisor", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("COVERAGE_")}
    # no build isolation: offline, with the setuptools the test extra installs
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
          "-w", base / "dist", src], cwd=base, env=env)
    wheel = next((base / "dist").glob("vram_advisor-*.whl"))
    env_dir = base / "venv"
    # no system site-packages, no pip of its own: the suite's pip installs into it (pip --python)
    _run([sys.executable, "-m", "venv", "--without-pip", env_dir], cwd=base, env=env)
    py = env_dir / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", "-q", wheel],
         cwd=base, env=env)
    # the wheel's dependencies, linked in a folder the environment lists in a .pth (after its own site-packages)
    deps = base / "deps"
    _link_distributions(_required_distributions(wheel), deps)
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], base, env).strip())
    (site / "wheel_dependencies.pth").write_text(f"{deps}\n")
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


def test_the_environment_holds_only_the_wheel_and_what_it_requires(venv):
    # what the suite's own installation has and the wheel does not require stays out of sight
    probe = ("import importlib.util as u; print([m for m in ('pytest', 'deepspeed', 'torchao', 'psycopg') "
             "if u.find_spec(m)])")
    assert _run([venv["py"], "-c", probe], venv["cwd"], venv["env"]).strip() == "[]"


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
