"""Whether the TUI can export here (the writing itself: advisor.configs.trial_export.export_trial)."""

from __future__ import annotations


def exporter_unavailable() -> str:
    """Why exporting cannot work in this installation ("" when advisor.configs.export imports)."""
    try:
        from advisor.configs.export import export_plan  # noqa: F401
    except ImportError as e:
        return f"Export is not available: advisor.configs.export could not be imported ({e})."
    return ""
