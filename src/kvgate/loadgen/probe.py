"""A cache probe: a shared-prefix workload sent one request at a time to a real
OpenAI-compatible endpoint (``/v1/completions``), and its measurement.

Several ~1,000-token prefixes (think: system prompt + documents), each asked several
questions. The order sends each prefix twice in a row first, then interleaves the rest,
so a cache-blind policy (round robin) splits repeats across nodes while a cache-aware
one keeps them together. TTFT is the time to the first streamed text chunk; cached
tokens are what the engine itself reports in ``usage.prompt_tokens_details``. The
real-engine tests and bench/real_engine.py use it.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from dataclasses import dataclass

import aiohttp

from kvgate.tokens import synthetic_text


@dataclass(frozen=True, slots=True)
class ProbeItem:
    prefix_id: int
    prompt: str


@dataclass(frozen=True, slots=True)
class Result:
    prefix_id: int
    repeat: bool  # this prefix was sent before in the run
    ttft_s: float
    latency_s: float
    prompt_tokens: int
    cached_tokens: int
    node: str | None


def build_workload(
    *, prefixes: int = 2, per_prefix: int = 3, prefix_tokens: int = 1000, seed: int = 7
) -> list[ProbeItem]:
    rng = random.Random(seed)
    texts = [synthetic_text(prefix_tokens, random.Random(seed * 1000 + p)) for p in range(prefixes)]
    order: list[int] = []
    for p in range(prefixes):
        order += [p] * min(2, per_prefix)
    for _ in range(max(0, per_prefix - 2)):
        order += list(range(prefixes))
    items = []
    for n, p in enumerate(order):
        question = synthetic_text(12, rng)
        items.append(ProbeItem(p, f"{texts[p]}\n\nQuestion {n}: {question}\nAnswer:"))
    return items


def client_session() -> aiohttp.ClientSession:
    # llama-server closes a connection after a streamed response; do not reuse them.
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


async def first_model(session: aiohttp.ClientSession, base_url: str) -> str:
    async with session.get(f"{base_url}/v1/models") as resp:
        resp.raise_for_status()
        data = await resp.json(content_type=None)
    return str(data["data"][0]["id"])


async def send(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    item: ProbeItem,
    *,
    repeat: bool,
    max_tokens: int = 4,
    timeout_s: float = 120.0,
) -> Result:
    body = {
        "model": model,
        "prompt": item.prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft: float | None = None
    usage: dict[str, object] = {}
    async with session.post(
        f"{base_url}/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)
    ) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:500]}")
        node = resp.headers.get("X-KVGate-Node")
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if ttft is None and any(c.get("text") for c in chunk.get("choices", [])):
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                usage = chunk["usage"]
    latency = time.perf_counter() - start
    details = usage.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
    return Result(
        prefix_id=item.prefix_id,
        repeat=repeat,
        ttft_s=ttft if ttft is not None else latency,
        latency_s=latency,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),  # type: ignore[call-overload]
        cached_tokens=cached,
        node=node,
    )


async def run_workload(
    base_url: str, items: list[ProbeItem], *, max_tokens: int = 4
) -> list[Result]:
    """Send the items one at a time (so TTFT measures caching, not queueing)."""
    seen: set[int] = set()
    results = []
    async with client_session() as session:
        model = await first_model(session, base_url)
        for item in items:
            results.append(
                await send(
                    session,
                    base_url,
                    model,
                    item,
                    repeat=item.prefix_id in seen,
                    max_tokens=max_tokens,
                )
            )
            seen.add(item.prefix_id)
    return results


@dataclass(frozen=True, slots=True)
class Summary:
    requests: int
    mean_ttft_s: float
    median_ttft_s: float
    cached_tokens: int
    prompt_tokens: int
    warm_requests: int  # requests where the engine reused at least half the prompt

    @property
    def cached_fraction(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def summarize(results: list[Result]) -> Summary:
    ttfts = [r.ttft_s for r in results]
    return Summary(
        requests=len(results),
        mean_ttft_s=statistics.fmean(ttfts),
        median_ttft_s=statistics.median(ttfts),
        cached_tokens=sum(r.cached_tokens for r in results),
        prompt_tokens=sum(r.prompt_tokens for r in results),
        warm_requests=sum(1 for r in results if r.cached_tokens * 2 >= r.prompt_tokens > 0),
    )
