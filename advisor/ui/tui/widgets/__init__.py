"""The app's widgets, each rendering plain records (see ``advisor.ui.tui.state`` and ``advisor.ui.tui.draw``)."""

from advisor.ui.tui.widgets.ledger_bars import LedgerBars
from advisor.ui.tui.widgets.pareto_plot import ParetoPlot
from advisor.ui.tui.widgets.prune_log import PruneLog
from advisor.ui.tui.widgets.trial_table import TrialTable
from advisor.ui.tui.widgets.winner import WinnerPanel

__all__ = ["LedgerBars", "ParetoPlot", "PruneLog", "TrialTable", "WinnerPanel"]
