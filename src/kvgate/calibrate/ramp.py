"""The stepped concurrency ramp against one engine (live, asyncio + aiohttp).

Closed loop: ``c`` workers each send one streamed completion at a time with a prompt of
``context - output_tokens`` tokens (unique per request, so no prefix-cache hits) and
``output_tokens`` forced output tokens. Workers are added with staggered starts and the
output length is jittered so the requests do not move in lock-step waves. Each step
waits for the new workers to settle, then measures for ``step_requests`` completions
(or ``step_seconds``), scraping the engine's /metrics through its adapter every
``scrape_interval_s``. The ramp is bounded by ``max_requests`` and ``max_seconds``.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kvgate.adapters import get_adapter
from kvgate.adapters.base import fetch_text, join_url
from kvgate.adapters.prom import MetricSet, parse_metrics
from kvgate.calibrate.histogram import (
    TPOT_HISTOGRAMS,
    TTFT_HISTOGRAMS,
    buckets,
    delta_mean,
    delta_quantile,
)
from kvgate.calibrate.knee import Knee, KneeRule, StepStats, find_knee
from kvgate.tasks import cancel_all
from kvgate.types import NodeReport

# Common English words: one token each in the simulated tokenizer and, mostly, in real ones.
_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "are",
    "with",
    "as",
    "his",
    "they",
    "be",
    "at",
    "one",
    "have",
    "this",
    "from",
    "or",
    "had",
    "by",
    "word",
    "but",
    "what",
    "some",
    "we",
    "can",
    "out",
    "other",
    "were",
    "all",
    "there",
    "when",
    "up",
    "use",
    "your",
    "how",
    "said",
    "an",
    "each",
    "she",
    "which",
    "do",
    "their",
    "time",
    "if",
    "will",
    "way",
    "about",
    "many",
    "then",
    "them",
    "write",
    "would",
    "like",
    "so",
    "these",
    "her",
    "long",
    "make",
    "thing",
    "see",
    "him",
    "two",
    "has",
    "look",
    "more",
    "day",
    "could",
    "go",
    "come",
    "did",
    "number",
    "sound",
    "no",
    "most",
    "people",
    "my",
    "over",
    "know",
    "water",
    "than",
    "call",
    "first",
    "who",
    "may",
    "down",
    "side",
    "been",
    "now",
    "find",
    "any",
    "new",
    "work",
    "part",
    "take",
    "get",
    "place",
    "made",
    "live",
    "where",
    "after",
    "back",
    "little",
    "only",
    "round",
    "man",
    "year",
    "came",
    "show",
    "every",
    "good",
    "me",
    "give",
    "our",
    "under",
    "name",
    "very",
    "through",
    "just",
    "form",
    "great",
    "think",
    "say",
    "help",
    "low",
    "line",
    "differ",
    "turn",
    "cause",
    "much",
    "mean",
    "before",
    "move",
    "right",
    "boy",
    "old",
    "too",
    "same",
    "tell",
    "does",
    "set",
    "three",
    "want",
    "air",
    "well",
    "also",
    "play",
    "small",
    "end",
    "put",
    "home",
    "read",
    "hand",
    "port",
    "large",
    "spell",
    "add",
    "even",
    "land",
    "here",
    "must",
    "big",
    "high",
    "such",
    "follow",
    "act",
    "why",
    "ask",
    "men",
    "change",
    "went",
    "light",
    "kind",
    "off",
    "need",
    "house",
    "picture",
    "try",
    "us",
    "again",
    "animal",
    "point",
    "mother",
]


@dataclass(frozen=True, slots=True)
class RampConfig:
    target: str  # engine base URL (no /v1)
    engine_type: str = "vllm"
    context: int = 1024  # prompt + output tokens per request
    output_tokens: int = 64
    model: str | None = None  # discovered from /v1/models when None
    start: int = 1
    growth: float = 1.35  # next concurrency = max(c + 1, round(c * growth))
    max_concurrency: int = 256
    step_requests: int = 24  # measured completions per step (at least 2 x concurrency)
    step_seconds: float = 60.0  # cap on one step's measuring time
    max_requests: int = 3000  # whole ramp
    max_seconds: float = 600.0  # whole ramp
    refine: int = 3  # bisection steps between the knee and the first step past it
    scrape_interval_s: float = 0.1
    request_timeout_s: float = 300.0
    seed: int = 0
    rule: KneeRule = field(default_factory=KneeRule)

    @property
    def prompt_tokens(self) -> int:
        return max(1, self.context - self.output_tokens)


@dataclass(slots=True)
class RequestRecord:
    started: float
    ttft: float | None = None
    e2e: float | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None
    error: str | None = None


@dataclass(slots=True)
class StepResult:
    concurrency: int
    requests: int
    errors: int
    duration_s: float
    throughput: float  # output tokens / s (client-counted, wall time)
    client_ttft_p50: float
    client_ttft_p99: float
    client_tpot_p99: float
    client_ttft_mean: float
    engine_ttft_p99: float | None
    engine_ttft_mean: float | None
    engine_tpot_p99: float | None
    runtime_tokens: float  # mean over the step's scrapes
    runtime_tokens_source: str  # engine_kv | client
    kv_usage: float | None
    running: float
    waiting: float
    preemptions: float
    error_kinds: dict[str, int] = field(default_factory=dict)

    @property
    def latency_source(self) -> str:
        return "engine" if self.engine_ttft_p99 is not None else "client"

    @property
    def ttft_p99(self) -> float:
        return self.engine_ttft_p99 if self.engine_ttft_p99 is not None else self.client_ttft_p99

    @property
    def ttft_mean(self) -> float:
        return self.engine_ttft_mean if self.engine_ttft_mean is not None else self.client_ttft_mean

    @property
    def tpot_p99(self) -> float:
        return self.engine_tpot_p99 if self.engine_tpot_p99 is not None else self.client_tpot_p99

    def stats(self) -> StepStats:
        return StepStats(
            self.concurrency,
            self.ttft_p99,
            self.tpot_p99,
            self.throughput,
            self.ttft_mean,
            self.preemptions,
            self.errors / self.requests if self.requests else 0.0,
        )

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]
        d["latency_source"] = self.latency_source
        return d


@dataclass(slots=True)
class RampResult:
    config: RampConfig
    model: str
    steps: list[StepResult]
    knee: Knee
    requests_sent: int
    elapsed_s: float
    stopped_by: str  # knee | max_requests | max_seconds | max_concurrency

    def sorted_steps(self) -> list[StepResult]:
        return sorted(self.steps, key=lambda s: s.concurrency)

    @property
    def knee_step(self) -> StepResult | None:
        steps = self.sorted_steps()
        return steps[self.knee.index] if 0 <= self.knee.index < len(steps) else None


class EngineUnreachable(RuntimeError):
    """The target does not answer /v1/models: nothing to calibrate."""


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


class Ramp:
    def __init__(self, config: RampConfig, session: aiohttp.ClientSession) -> None:
        self.cfg = config
        self.session = session
        self.adapter = get_adapter(config.engine_type)
        self.rng = random.Random(config.seed)
        self.model = config.model or ""
        self.records: list[RequestRecord] = []
        self.in_flight: dict[int, tuple[int, int]] = {}  # id -> (prompt tokens, received)
        self.tokens_received = 0
        self.sent = 0
        self._words_per_token = 1.0  # corrected from the engine's reported prompt tokens
        self._target = 0  # workers with index < target keep sending
        self._workers: list[asyncio.Task[None]] = []
        self._next_id = 0
        self._stop = False
        self._deadline = 0.0
        self._report: NodeReport | None = None

    # -- requests ----------------------------------------------------------------------
    def _prompt(self, request_id: int) -> str:
        n_words = max(1, int(self.cfg.prompt_tokens * self._words_per_token) - 2)
        words = self.rng.choices(_WORDS, k=n_words)
        return f"{request_id} " + " ".join(words)

    def _output_tokens(self) -> int:
        n = self.cfg.output_tokens
        return max(1, round(n * self.rng.uniform(0.75, 1.25)))

    async def _send(self, request_id: int) -> RequestRecord:
        out = self._output_tokens()
        body = {
            "prompt": self._prompt(request_id),
            "max_tokens": out,
            "min_tokens": out,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0.0,
        }
        if self.model:
            body["model"] = self.model
        rec = RequestRecord(started=time.monotonic())
        self.in_flight[request_id] = (self.cfg.prompt_tokens, 0)
        try:
            timeout = aiohttp.ClientTimeout(total=self.cfg.request_timeout_s)
            async with self.session.post(
                join_url(self.cfg.target, "/v1/completions"), json=body, timeout=timeout
            ) as resp:
                if resp.status != 200:
                    rec.error = f"HTTP {resp.status}"
                    await resp.read()
                    return rec
                async for line in resp.content:
                    self._on_line(line, rec, request_id)
            rec.e2e = time.monotonic() - rec.started
            if rec.ttft is None:
                rec.error = "no tokens"
        except (aiohttp.ClientError, TimeoutError) as exc:
            rec.error = type(exc).__name__
        finally:
            self.in_flight.pop(request_id, None)
        return rec

    def _on_line(self, line: bytes, rec: RequestRecord, request_id: int) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if not payload or payload == b"[DONE]":
            return
        try:
            chunk = json.loads(payload)
        except ValueError:
            return
        usage = chunk.get("usage")
        if isinstance(usage, dict) and usage.get("prompt_tokens"):
            rec.prompt_tokens = int(usage["prompt_tokens"])
        for choice in chunk.get("choices") or ():
            if choice.get("text"):
                if rec.ttft is None:
                    rec.ttft = time.monotonic() - rec.started
                rec.output_tokens += 1
                self.tokens_received += 1
                prompt, got = self.in_flight.get(request_id, (self.cfg.prompt_tokens, 0))
                self.in_flight[request_id] = (prompt, got + 1)

    def _learn_prompt_size(self, rec: RequestRecord) -> None:
        """Scale the words sent so the engine's own prompt count meets the target."""
        if rec.prompt_tokens:
            ratio = self.cfg.prompt_tokens / rec.prompt_tokens
            if abs(ratio - 1.0) > 0.03:
                self._words_per_token = max(0.1, min(10.0, self._words_per_token * ratio))

    async def _worker(self, index: int, delay: float) -> None:
        await asyncio.sleep(delay)
        while not self._stop and index < self._target:
            if self.sent >= self.cfg.max_requests or time.monotonic() >= self._deadline:
                self._stop = True
                return
            self.sent += 1
            self._next_id += 1
            rec = await self._send(self._next_id)
            self._learn_prompt_size(rec)
            self.records.append(rec)

    # -- metrics -----------------------------------------------------------------------
    async def _scrape(self) -> tuple[NodeReport | None, MetricSet | None]:
        url = self.cfg.target
        try:
            text = await fetch_text(self.session, join_url(url, self.adapter.metrics_path), 5.0)
        except Exception:
            return None, None
        extra = await self.adapter.fetch_extra(
            self.session, url, node_id="calibrate", timeout_s=5.0
        )
        now = time.time()
        report = self.adapter.parse(
            text, node_id="calibrate", now=now, previous=self._report, **extra
        )
        self._report = report
        try:
            metrics = parse_metrics(text)
        except ValueError:
            metrics = None
        return (None if report.stale else report), metrics

    def _runtime_tokens(self, report: NodeReport | None) -> tuple[float, str]:
        if report is not None and report.kv_capacity_tokens:
            kv = report.kv_usage * report.kv_capacity_tokens
            return kv + report.waiting * self.cfg.prompt_tokens, "engine_kv"
        return float(sum(p + g for p, g in self.in_flight.values())), "client"

    # -- steps -------------------------------------------------------------------------
    async def _set_concurrency(self, c: int, spread_s: float) -> None:
        old = self._target
        self._target = c
        self._workers = [w for w in self._workers if not w.done()]
        alive = len(self._workers)
        for i in range(alive, c):
            delay = spread_s * (i - old) / max(1, c - old) if i >= old else 0.0
            self._workers.append(asyncio.create_task(self._worker(i, max(0.0, delay))))

    async def run_step(self, c: int) -> StepResult | None:
        recent = [r.e2e for r in self.records[-50:] if r.e2e is not None]
        e2e_estimate = statistics.median(recent) if recent else 0.0
        await self._set_concurrency(c, e2e_estimate)
        # settle: new workers spread their starts over one request time; drop that period
        settle_until = time.monotonic() + min(1.5 * e2e_estimate, self.cfg.step_seconds / 2)
        while time.monotonic() < settle_until and not self._stop:
            await asyncio.sleep(min(0.05, settle_until - time.monotonic()))
        if self._stop:
            return None
        measure_from = time.monotonic()
        first_index = len(self.records)
        tokens_before = self.tokens_received
        _, metrics_before = await self._scrape()
        samples: list[tuple[NodeReport | None, float, str]] = []
        want = max(self.cfg.step_requests, 2 * c)
        step_end = measure_from + self.cfg.step_seconds
        while not self._stop:
            done = [r for r in self.records[first_index:] if r.started >= measure_from]
            if len(done) >= want or time.monotonic() >= step_end:
                break
            report, _ = await self._scrape()
            tokens, source = self._runtime_tokens(report)
            samples.append((report, tokens, source))
            await asyncio.sleep(self.cfg.scrape_interval_s)
        duration = time.monotonic() - measure_from
        _, metrics_after = await self._scrape()
        done = [r for r in self.records[first_index:] if r.started >= measure_from]
        if not done or not samples:
            return None
        return self._summarise(
            c, done, samples, duration, tokens_before, metrics_before, metrics_after
        )

    def _summarise(
        self,
        c: int,
        done: list[RequestRecord],
        samples: list[tuple[NodeReport | None, float, str]],
        duration: float,
        tokens_before: int,
        before: MetricSet | None,
        after: MetricSet | None,
    ) -> StepResult:
        ok = [r for r in done if r.error is None and r.ttft is not None and r.e2e is not None]
        ttfts = [r.ttft for r in ok if r.ttft is not None]
        tpots = [
            (r.e2e - r.ttft) / (r.output_tokens - 1)
            for r in ok
            if r.e2e is not None and r.ttft is not None and r.output_tokens > 1
        ]
        reports = [s[0] for s in samples if s[0] is not None]
        sources = {s[2] for s in samples}
        engine_ttft = engine_tpot = engine_mean = None
        if before is not None and after is not None:
            engine_ttft = delta_quantile(
                buckets(before, TTFT_HISTOGRAMS), buckets(after, TTFT_HISTOGRAMS), 0.99
            )
            engine_mean = delta_mean(before, after, TTFT_HISTOGRAMS)
            engine_tpot = delta_quantile(
                buckets(before, TPOT_HISTOGRAMS), buckets(after, TPOT_HISTOGRAMS), 0.99
            )
        kv = [r.kv_usage for r in reports if r.kv_capacity_tokens]
        return StepResult(
            concurrency=c,
            requests=len(done),
            errors=len(done) - len(ok),
            duration_s=duration,
            throughput=(self.tokens_received - tokens_before) / duration if duration > 0 else 0.0,
            client_ttft_p50=percentile(ttfts, 0.5),
            client_ttft_p99=percentile(ttfts, 0.99),
            client_tpot_p99=percentile(tpots, 0.99),
            client_ttft_mean=statistics.fmean(ttfts) if ttfts else 0.0,
            engine_ttft_p99=engine_ttft,
            engine_ttft_mean=engine_mean,
            engine_tpot_p99=engine_tpot,
            runtime_tokens=statistics.fmean(s[1] for s in samples),
            runtime_tokens_source="engine_kv" if sources == {"engine_kv"} else "client",
            kv_usage=statistics.fmean(kv) if kv else None,
            running=statistics.fmean(r.running for r in reports) if reports else 0.0,
            waiting=statistics.fmean(r.waiting for r in reports) if reports else 0.0,
            preemptions=(reports[-1].preemptions_total - reports[0].preemptions_total)
            if reports
            else 0.0,
            error_kinds=dict(Counter(r.error for r in done if r.error is not None)),
        )

    # -- the ramp ----------------------------------------------------------------------
    def _knee(self, steps: list[StepResult]) -> Knee:
        ordered = sorted(steps, key=lambda s: s.concurrency)
        return find_knee([s.stats() for s in ordered], self.cfg.rule)

    async def run(self) -> RampResult:
        cfg = self.cfg
        started = time.monotonic()
        self._deadline = started + cfg.max_seconds
        if not self.model:
            self.model = await _discover_model(self.session, cfg.target)
        if not self.model:
            raise EngineUnreachable(f"{cfg.target}/v1/models did not answer with a model")
        steps: list[StepResult] = []
        c = cfg.start
        stopped_by = "max_concurrency"
        try:
            # ramp up until a step is past the knee (and a flat throughput is confirmed)
            while c <= cfg.max_concurrency:
                step = await self.run_step(c)
                if step is None:
                    stopped_by = "max_requests" if self.sent >= cfg.max_requests else "max_seconds"
                    break
                steps.append(step)
                knee = self._knee(steps)
                if knee.reached and knee.confirmed:
                    stopped_by = "knee"
                    break
                c = max(c + 1, round(c * cfg.growth))
            # refine: bisect between the knee and the first step past it
            for _ in range(cfg.refine):
                knee = self._knee(steps)
                ordered = sorted(steps, key=lambda s: s.concurrency)
                if not knee.reached or knee.index < 0 or knee.past_index is None:
                    break
                lo, hi = ordered[knee.index].concurrency, ordered[knee.past_index].concurrency
                if hi - lo <= 1:
                    break
                step = await self.run_step((lo + hi) // 2)
                if step is None:
                    break
                steps.append(step)
        finally:
            self._stop = True
            self._target = 0
            await cancel_all(self._workers)
        return RampResult(
            config=cfg,
            model=self.model,
            steps=sorted(steps, key=lambda s: s.concurrency),
            knee=self._knee(steps),
            requests_sent=self.sent,
            elapsed_s=time.monotonic() - started,
            stopped_by=stopped_by,
        )


async def _discover_model(session: aiohttp.ClientSession, base_url: str) -> str:
    try:
        async with session.get(
            join_url(base_url, "/v1/models"), timeout=aiohttp.ClientTimeout(total=10)
        ) as resp:
            data = await resp.json(content_type=None)
        return str(data["data"][0]["id"])
    except (aiohttp.ClientError, TimeoutError, KeyError, IndexError, ValueError, TypeError):
        return ""


async def run_ramp(config: RampConfig) -> RampResult:
    # one connection per request: servers that drop idle keep-alive connections (llama.cpp)
    # would otherwise show up as failed requests, and a connect on loopback costs nothing
    # next to an LLM request
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        return await Ramp(config, session).run()
