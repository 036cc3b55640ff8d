"""Modal screens: a trial's details and the export dialog."""

from advisor.ui.tui.screens.details import DetailsScreen
from advisor.ui.tui.screens.export import ExportScreen

__all__ = ["DetailsScreen", "ExportScreen"]
