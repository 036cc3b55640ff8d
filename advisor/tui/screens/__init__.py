"""Modal screens: a trial's details and the export dialog."""

from advisor.tui.screens.details import DetailsScreen
from advisor.tui.screens.export import ExportScreen

__all__ = ["DetailsScreen", "ExportScreen"]
