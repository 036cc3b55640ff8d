"""Where a model's derived description is kept, so that the CLI never builds a catalog model per call.

- The catalog's models: ``advisor/data/architectures_derived.json``, generated from ``models.yaml`` by
  ``python -m advisor.core.architecture_store --write`` (tests/test_architecture_store.py checks that regenerating
  it gives the committed file). Reading it imports neither torch nor transformers.
- Any other config (a local directory's config.json, a hub id in the local HF cache, a test's tiny config):
  derived once by ``advisor.core.architecture.describe_architecture`` (a meta-device build, seconds the first time
  in a process) and kept in the user cache, ``$ADVISOR_ARCHITECTURE_CACHE`` or
  ``$XDG_CACHE_HOME/vram-advisor/architectures`` (``~/.cache`` when unset), one JSON file per config, named by the
  config's key, the description version and the transformers version that derived it.

Both are found by ``config_key(config)``: a local copy of a catalog model's config is answered from the data file.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from functools import lru_cache
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from advisor.core.architecture import DESCRIPTION_VERSION, ArchitectureDescription, config_key

DATA_FILE = "architectures_derived.json"
CACHE_ENV = "ADVISOR_ARCHITECTURE_CACHE"

_MEMO: dict[str, ArchitectureDescription] = {}
"""Descriptions already read or derived in this process, by config key."""


@lru_cache(maxsize=1)
def _stored() -> dict[str, Any]:
    """The committed data file: {config key: stored description}, and the catalog key of each."""
    text = resources.files("advisor").joinpath("data", DATA_FILE).read_text(encoding="utf-8")
    data = json.loads(text)
    return {entry["config_key"]: entry["description"] for entry in data["models"].values()}


def stored_description(config: dict[str, Any]) -> ArchitectureDescription | None:
    """The committed description of ``config`` (a catalog model's), or None."""
    key = config_key(config)
    if key in _MEMO:
        return _MEMO[key]
    found = _stored().get(key)
    if found is None:
        return None
    desc = ArchitectureDescription.from_dict(found)
    _MEMO[key] = desc
    return desc


def cache_dir() -> Path:
    """The user cache of descriptions derived at run time."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "vram-advisor" / "architectures"


def _transformers_version() -> str:
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:  # pragma: no cover - transformers is a dependency
        return "unknown"


def _cache_path(key: str) -> Path:
    return cache_dir() / f"{key}-v{DESCRIPTION_VERSION}-transformers{_transformers_version()}.json"


def description_for(config: dict[str, Any], *, trust_remote_code: bool = False) -> tuple[ArchitectureDescription, str]:
    """The description of ``config`` and where it came from: stored (the data file), cache (the user cache) or
    derived (a meta-device build now, then kept in the user cache)."""
    key = config_key(config)
    if key in _MEMO:
        return _MEMO[key], "memo"
    stored = stored_description(config)
    if stored is not None:
        return stored, "stored"
    path = _cache_path(key)
    if path.is_file():
        try:
            desc = ArchitectureDescription.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, KeyError, TypeError):
            desc = None  # a damaged or older file: derive again
        if desc is not None:
            _MEMO[key] = desc
            return desc, "cache"
    from advisor.core.architecture import describe_architecture

    desc = describe_architecture(config, trust_remote_code=trust_remote_code)
    _MEMO[key] = desc
    _write_cache(path, desc)
    return desc, "derived"


def _write_cache(path: Path, desc: ArchitectureDescription) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(desc.to_dict(), f)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache costs a derivation per process, nothing else


# --------------------------------------------------------------------------- the committed data file


def derived_catalog() -> dict[str, Any]:
    """The data file's content for the current models.yaml: every catalog model derived again."""
    from advisor.core.architecture import describe_architecture
    from advisor.core.data_files import load_data_file

    models = {}
    version = ""
    for key, entry in load_data_file("models.yaml").items():
        desc = describe_architecture(entry["config"])
        version = desc.transformers_version
        models[key] = {"config_key": config_key(entry["config"]), "description": desc.to_dict()}
    return {"about": "Generated by `python -m advisor.core.architecture_store --write` from models.yaml: each catalog "
                     "model's description, derived from a meta-device build with transformers "
                     "(advisor/core/architecture.py). Do not edit by hand.",
            "description_version": DESCRIPTION_VERSION, "transformers": version, "models": models}


def render(data: dict[str, Any]) -> str:
    """The data file's text: one model per block, keys sorted (diffs stay readable)."""
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def data_file_path() -> Path:
    return Path(__file__).resolve().parents[1] / "data" / DATA_FILE


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m advisor.core.architecture_store",
                                 description="Derive the catalog models' descriptions and store them.")
    ap.add_argument("--write", action="store_true", help=f"write advisor/data/{DATA_FILE}")
    ap.add_argument("--check", action="store_true", help="exit 1 when the committed file differs")
    args = ap.parse_args(argv)
    text = render(derived_catalog())
    path = data_file_path()
    if args.write:
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path} ({len(text):,} bytes)")
        return 0
    same = path.is_file() and path.read_text(encoding="utf-8") == text
    print(f"{path}: {'up to date' if same else 'differs from a fresh derivation (run with --write)'}")
    return 0 if same or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
