"""The data files shipped in ``advisor/data/`` (catalogs, priors, overheads, rules), read in one way.

Every module that reads a shipped YAML file calls ``load_data_file``; each caller caches what it
parsed where it asks often. The files travel in the wheel as package data (``importlib.resources``).
"""

from __future__ import annotations

from importlib import resources
from typing import Any


def load_data_file(name: str) -> Any:
    """``advisor/data/<name>`` parsed as YAML (``yaml.safe_load``; with libyaml's parser where PyYAML has it: the
    same objects, several times faster, which the CLI's start-up feels on models.yaml)."""
    import yaml

    text = resources.files("advisor").joinpath("data", name).read_text(encoding="utf-8")
    loader = getattr(yaml, "CSafeLoader", None)
    return yaml.load(text, Loader=loader) if loader is not None else yaml.safe_load(text)


__all__ = ["load_data_file"]
