"""`advisor report`: a study as report.html (self-contained, offline), report.md and trials.csv.

Modules, one concern each:

- ``_load``      read a study (Optuna storage, export folders) into a ``StudySnapshot`` (the only I/O)
- ``_data``      ``gather(snapshot) -> ReportData``: selection, timeline, comparisons, environment (pure)
- ``_plots``     matplotlib figures as inline SVG (imported late)
- ``_html``      report.html;  ``_markdown``  report.md;  ``_csv``  trials.csv
"""

from __future__ import annotations

from pathlib import Path

from advisor.ui.report._data import Comparison, ReportData, gather
from advisor.ui.report._load import StudySnapshot, open_study, resolve_storage

__all__ = ["Comparison", "ReportData", "StudySnapshot", "gather", "open_study", "resolve_storage", "write_report"]


def write_report(data: ReportData, out_dir: str | Path) -> dict[str, Path]:
    """Render ``data`` into ``out_dir``; {file name: path written}."""
    from advisor.ui.report._csv import render_csv
    from advisor.ui.report._html import render_html
    from advisor.ui.report._markdown import render_markdown
    from advisor.ui.report._plots import render_all

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    texts = {"report.html": render_html(data, render_all(data)), "report.md": render_markdown(data),
             "trials.csv": render_csv(data)}
    paths = {}
    for name, text in texts.items():
        path = out / name
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        paths[name] = path
    return paths
