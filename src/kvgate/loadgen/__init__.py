"""``kvgate bench``: live open- or closed-loop load against an OpenAI-compatible endpoint."""

from kvgate.loadgen.runner import BenchProgress, BenchResult, arrival_scale_for_rate, run_bench

__all__ = ["BenchProgress", "BenchResult", "arrival_scale_for_rate", "run_bench"]
