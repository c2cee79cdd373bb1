"""One report format for the simulator, the live bench and the demo."""

from kvgate.report.records import RequestRecord
from kvgate.report.summary import jain_fairness, markdown_table, percentile, summarize
from kvgate.report.writers import write_report

__all__ = [
    "RequestRecord",
    "jain_fairness",
    "markdown_table",
    "percentile",
    "summarize",
    "write_report",
]
