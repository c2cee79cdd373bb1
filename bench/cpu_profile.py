"""Run a module under cProfile with a CPU-time clock (not wall time) and dump the stats.

    python bench/cpu_profile.py OUT.prof -m kvgate serve ...

The default cProfile clock is wall time, which on a loaded machine charges every
preemption to whatever function was running (socket sends look like milliseconds).
"""

from __future__ import annotations

import cProfile
import runpy
import sys
import time


def main() -> None:
    out, rest = sys.argv[1], sys.argv[2:]
    if len(rest) < 2 or rest[0] != "-m":
        raise SystemExit("usage: cpu_profile.py OUT.prof -m MODULE [ARGS...]")
    sys.argv = [rest[1], *rest[2:]]
    profile = cProfile.Profile(time.process_time)
    try:
        profile.runcall(runpy.run_module, rest[1], run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
    finally:
        profile.dump_stats(out)


if __name__ == "__main__":
    main()
