"""Python cost of one streamed chunk on kvgate's byte path, in isolation.

    python bench/relay_chunk.py [--src DIR] [--chunks 50000] [--repeat 5]

An engine's chunk (chunked framing, one OpenAI chat delta with the injected
``"usage":null``) goes through ``Exchange.data_received`` → de-chunk → ``SseRelay.feed``
(scans, usage strip, token count) → one framed ``write`` to a transport that drops it.
No syscall is made: this is the Python work per chunk the socket ``recv``/``send`` come on
top of. Prints the best of ``--repeat`` runs, in µs per chunk. ``--src`` imports kvgate
from another tree (e.g. an unpacked ``git archive main src``) for a same-machine
comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time


class _NullTransport:
    def write(self, data: bytes) -> None:
        return None

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0


def _chunk(i: int) -> bytes:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "sim",
        "choices": [{"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": None}],
        "usage": None,
    }
    event = b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"
    return b"%x\r\n%b\r\n" % (len(event), event)


async def _measure(chunks: int, repeat: int) -> float:
    from kvgate.gateway.bytepath import SseRelay
    from kvgate.gateway.upstream import Exchange, UpstreamPool

    exchange = Exchange(UpstreamPool(connect_timeout_s=1), ("127.0.0.1", 1))
    exchange.data_received(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    relay = SseRelay(exchange, strip_usage=True, on_progress=lambda n: None, progress_batch=16)
    exchange.attach(relay.feed)
    relay.go_live(_NullTransport(), chunked=True)  # type: ignore[arg-type]
    chunk = _chunk(7)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(chunks):
            exchange.data_received(chunk)
        best = min(best, (time.perf_counter() - t0) / chunks)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", help="import kvgate from this directory")
    parser.add_argument("--chunks", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if args.src:
        sys.path.insert(0, args.src)
    per_chunk = asyncio.run(_measure(args.chunks, args.repeat))
    print(json.dumps({"python_us_per_chunk": round(per_chunk * 1e6, 2)}))


if __name__ == "__main__":
    main()
