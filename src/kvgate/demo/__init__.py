"""``kvgate demo``: simulated engines + gateway + a workload through two policies."""
