"""The app's widgets, each rendering plain records (see ``advisor.tui.state`` and ``advisor.tui.draw``)."""

from advisor.tui.widgets.ledger_bars import LedgerBars
from advisor.tui.widgets.pareto_plot import ParetoPlot
from advisor.tui.widgets.prune_log import PruneLog
from advisor.tui.widgets.trial_table import TrialTable
from advisor.tui.widgets.winner import WinnerPanel

__all__ = ["LedgerBars", "ParetoPlot", "PruneLog", "TrialTable", "WinnerPanel"]
