"""Where a gateway's CPU goes, by part, from py-spy's raw (collapsed-stack) output.

    py-spy record --pid PID --nonblocking --format raw -r 200 -d 75 -o OUT.raw
    python bench/spy_breakdown.py OUT.raw [CPU_US_PER_REQUEST]

A sample belongs to the first part that matches walking up its stack from the leaf
(so a socket ``send`` made inside the relay counts as a client write, not as the relay's
Python). With the CPU per request of the same run, each share is also given in µs.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Callable

Rule = Callable[[str, str, bool], bool]
PARTS: list[tuple[str, Rule]] = [
    ("client writes (send syscall)", lambda fn, path, leaf: leaf and fn == "SseRelay._out"),
    ("engine request write (send syscall)", lambda fn, path, leaf: leaf and fn == "Exchange.send"),
    ("event loop, C side", lambda fn, path, leaf: leaf and fn == "Runner.run"),
    ("scraper", lambda fn, path, leaf: "scraper.py" in path or "adapters/" in path),
    (
        "prompt render + block hashes",
        lambda fn, path, leaf: path.endswith(("routing/request.py", "tokens.py", "prompts.py")),
    ),
    ("routing", lambda fn, path, leaf: "kvgate/routing/" in path),
    (
        "admission",
        lambda fn, path, leaf: (
            any(p in path for p in ("kvgate/admission/", "forecast", "store/"))
            or "observed_admit" in fn
        ),
    ),
    ("pipeline glue", lambda fn, path, leaf: "kvgate/pipeline/" in path),
    (
        "body read + JSON",
        lambda fn, path, leaf: path.endswith(
            ("gateway/body.py", "json/decoder.py", "json/__init__.py")
        ),
    ),
    (
        "byte path Python",
        lambda fn, path, leaf: path.endswith(("gateway/bytepath.py", "gateway/upstream.py")),
    ),
    ("Prometheus metrics", lambda fn, path, leaf: "prometheus_client" in path),
    ("aiohttp", lambda fn, path, leaf: "aiohttp/" in path),
    ("kvgate handlers / proxy / logs", lambda fn, path, leaf: "kvgate/gateway/" in path),
    ("asyncio (Python side)", lambda fn, path, leaf: "asyncio/" in path),
]
_FRAME = re.compile(r"(.*) \((.*?):(\d+)\)")


def part_of(stack: str) -> str:
    frames = [
        (m.group(1), m.group(2)) if (m := _FRAME.match(f)) else (f, "") for f in stack.split(";")
    ]
    for i in range(len(frames) - 1, -1, -1):
        fn, path = frames[i]
        leaf = i == len(frames) - 1
        for name, rule in PARTS:
            if rule(fn, path, leaf):
                return name
    return "other"


def main() -> None:
    parts: Counter[str] = Counter()
    with open(sys.argv[1]) as raw:
        for line in raw:
            stack, _, count = line.rstrip().rpartition(" ")
            parts[part_of(stack)] += int(count)
    total = sum(parts.values())
    us = float(sys.argv[2]) if len(sys.argv) > 2 else None
    for name, n in parts.most_common():
        extra = f" | {us * n / total:.0f} µs" if us else ""
        print(f"{name} | {100 * n / total:.1f}%{extra}")
    print(f"samples: {total}")


if __name__ == "__main__":
    main()
