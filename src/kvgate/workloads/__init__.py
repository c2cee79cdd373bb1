"""Parameterised workloads shared by the simulator, the live bench and the demo.

A workload is a deterministic (for a seed) list of ``WorkItem``s. Each item is a chat
request whose prompt is built from synthetic text of exact token counts
(``kvgate.tokens.synthetic_text``), so the simulator's token counts and block hashes are
exactly what the simulated engine computes from the same body. See docs/workloads.md.
"""

from kvgate.workloads.base import PromptCache, WorkItem, Workload
from kvgate.workloads.catalog import WORKLOAD_NAMES, WORKLOADS, generate_workload

__all__ = [
    "WORKLOADS",
    "WORKLOAD_NAMES",
    "PromptCache",
    "WorkItem",
    "Workload",
    "generate_workload",
]
