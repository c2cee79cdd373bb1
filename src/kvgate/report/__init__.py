"""Run metrics and writers shared by the simulator, the live bench and the demo."""

from kvgate.report.metrics import compute_metrics, markdown_table, write_reports

__all__ = ["compute_metrics", "markdown_table", "write_reports"]
