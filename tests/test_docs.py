"""The documentation holds together: every page of docs/ is in its index, and every relative link resolves."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_every_page_is_in_the_index():
    index = (DOCS / "README.md").read_text()
    linked = set(LINK.findall(index))
    missing = [p.name for p in DOCS.glob("*.md") if p.name != "README.md" and p.name not in linked]
    assert not missing, f"docs/README.md does not list {missing}"


def test_relative_links_resolve():
    broken = []
    for page in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *DOCS.glob("*.md")]:
        for target in LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken
