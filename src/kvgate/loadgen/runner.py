"""Live load against an OpenAI-compatible endpoint: open loop or closed loop.

Every issued request yields exactly one ``RequestRecord`` (the simulator's record type):
``ok`` (streamed to the end), ``degraded`` (admitted on a degrade path: the
``X-KVGate-Admission`` header says ``degrade=…``, or 202 for the async job path),
``rejected`` (429 / 408 / 503: never retried) or ``error`` (any other status, a broken
stream, a connection failure, a timeout, or cancelled at the drain deadline).

Open loop replays the work items at their arrival times, divided by ``time_scale``
(``arrival_scale``); closed loop keeps ``concurrency`` requests in flight, each worker
sending the next item as soon as its previous one ends. ``max_requests`` and
``duration_s`` bound what is issued; in-flight requests then get ``drain_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kvgate.report.records import RequestRecord
from kvgate.workloads import WorkItem

REJECT_STATUSES = frozenset({429, 408, 503})


@dataclass
class BenchProgress:
    """Counters the progress display reads while a run is going."""

    total: int
    issued: int = 0
    done: int = 0
    ok: int = 0
    rejected: int = 0
    errors: int = 0
    degraded: int = 0

    def add(self, rec: RequestRecord) -> None:
        self.done += 1
        if rec.status == "ok":
            self.ok += 1
        elif rec.status == "rejected":
            self.rejected += 1
        elif rec.status == "degraded":
            self.degraded += 1
        else:
            self.errors += 1


@dataclass
class BenchResult:
    records: list[RequestRecord]
    issued: int
    duration_s: float  # wall seconds from the start to the last record
    mode: str  # "open" | "closed"
    model: str | None = None
    errors: dict[str, int] = field(default_factory=dict)  # error text -> count


def arrival_scale_for_rate(items: Sequence[WorkItem], rate: float) -> float:
    """Factor that turns the items' arrival times into a mean rate of ``rate`` per second."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    if not items or items[-1].arrival <= 0:
        return 1.0  # all at t=0: nothing to rescale
    own_rate = len(items) / items[-1].arrival
    return own_rate / rate


async def discover_model(
    session: aiohttp.ClientSession, target: str, headers: dict[str, str]
) -> str:
    async with session.get(target + "/v1/models", headers=headers) as resp:
        resp.raise_for_status()
        data = await resp.json()
    models = [m.get("id") for m in data.get("data") or [] if m.get("id")]
    if not models:
        raise RuntimeError(f"{target}/v1/models lists no model")
    return str(models[0])


def _has_token(chunk: dict[str, Any]) -> bool:
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content") or choice.get("text"):
            return True
    return False


def _admission(header: str | None) -> tuple[str, float]:
    """``admit; reason=elastic; queued_ms=12`` -> ("admit", 0.012)."""
    if not header:
        return "admit", 0.0
    parts = [p.strip() for p in header.split(";")]
    queued = 0.0
    for p in parts[1:]:
        k, _, v = p.partition("=")
        if k == "queued_ms":
            with contextlib.suppress(ValueError):
                queued = float(v) / 1000.0
    return parts[0] or "admit", queued


class _Sender:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        target: str,
        headers_for: Callable[[WorkItem], dict[str, str]],
        model: str | None,
        t0: float,
    ) -> None:
        self.session = session
        self.url = target + "/v1/chat/completions"
        self.headers_for = headers_for
        self.model = model
        self.t0 = t0
        self.error: str | None = None

    def body(self, item: WorkItem) -> dict[str, Any]:
        body = item.chat_body()
        if self.model is not None and body.get("model") in (None, "", "default"):
            body["model"] = self.model
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        body["max_tokens"] = item.max_tokens
        body["ignore_eos"] = True
        return body

    async def send(self, item: WorkItem, rec: RequestRecord, sent: float) -> None:
        """Fill ``rec`` from one streamed request; never raises (except cancellation)."""
        try:
            async with self.session.post(
                self.url, json=self.body(item), headers=self.headers_for(item)
            ) as resp:
                rec.http_status = resp.status
                rec.node = resp.headers.get("X-KVGate-Node")
                with contextlib.suppress(TypeError, ValueError):
                    rec.expected_cached_tokens = int(
                        resp.headers.get("X-KVGate-Expected-Cached-Tokens") or 0
                    )
                admission_header = resp.headers.get("X-KVGate-Admission")
                rec.admission, rec.queued_s = _admission(admission_header)
                degraded = "degrade=" in (admission_header or "")
                if resp.status in REJECT_STATUSES:
                    rec.status = "rejected"
                    await resp.read()
                    rec.e2e = time.monotonic() - sent
                    return
                if resp.status == 202:
                    rec.status = "degraded"  # the async job path: no stream to time
                    await resp.read()
                    return
                if resp.status != 200:
                    rec.status = "error"
                    self.error = f"HTTP {resp.status}"
                    await resp.read()
                    return
                first: float | None = None
                last: float | None = None
                chunks = 0
                finished = False
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        finished = True
                        break
                    chunk = json.loads(data)
                    if _has_token(chunk):
                        now = time.monotonic()
                        if first is None:
                            first = now
                        last = now
                        chunks += 1
                    usage = chunk.get("usage")
                    if usage:
                        rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                        rec.output_tokens = int(usage.get("completion_tokens") or 0)
                        details = usage.get("prompt_tokens_details") or {}
                        rec.cached_tokens = int(details.get("cached_tokens") or 0)
                end = time.monotonic()
                if not rec.output_tokens:
                    rec.output_tokens = chunks
                if first is not None:
                    rec.ttft = first - sent
                    rec.e2e = (last or end) - sent
                    if rec.output_tokens > 1 and last is not None:
                        rec.tpot = (last - first) / (rec.output_tokens - 1)
                if not finished:
                    rec.status = "error"
                    self.error = "stream ended without [DONE]"
                else:
                    rec.status = "degraded" if degraded else "ok"
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, TimeoutError, ValueError, OSError) as exc:
            rec.status = "error"
            self.error = f"{type(exc).__name__}: {exc}"[:120]


async def run_bench(
    target: str,
    items: Sequence[WorkItem],
    *,
    concurrency: int | None = None,
    arrival_scale: float = 1.0,
    duration_s: float | None = None,
    max_requests: int | None = None,
    api_key: str | None = None,
    api_keys: dict[str, str] | None = None,
    model: str | None = None,
    request_timeout_s: float = 120.0,
    drain_timeout_s: float | None = None,
    progress: BenchProgress | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> BenchResult:
    """Run ``items`` against ``target``; return one record per issued request.

    ``concurrency`` set: closed loop with that many workers; else open loop at
    ``item.arrival * arrival_scale``. ``api_keys`` maps tenant -> key (falls back to
    ``api_key``). ``model`` replaces the items' placeholder model ``default``; None
    discovers it from ``/v1/models`` when an item uses the placeholder.
    """
    target = target.rstrip("/")
    if concurrency is not None and concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    todo = list(items if max_requests is None else items[:max_requests])
    prog = progress if progress is not None else BenchProgress(total=len(todo))
    prog.total = len(todo)
    drain = request_timeout_s if drain_timeout_s is None else drain_timeout_s
    records: list[RequestRecord] = []
    errors: dict[str, int] = {}

    def headers_for(item: WorkItem) -> dict[str, str]:
        h: dict[str, str] = {}
        key = (api_keys or {}).get(item.tenant, api_key)
        if key:
            h["Authorization"] = f"Bearer {key}"
        if item.priority_class and item.priority_class != "interactive":
            h["X-KVGate-Class"] = item.priority_class
        return h

    timeout = aiohttp.ClientTimeout(total=request_timeout_s)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        if model is None and any(it.model in ("", "default") for it in todo):
            h = headers_for(todo[0]) if todo else {}
            model = await discover_model(session, target, h)
        t0 = time.monotonic()
        deadline = t0 + duration_s if duration_s is not None else None
        last_end = t0

        async def one(item: WorkItem) -> None:
            nonlocal last_end
            sent = time.monotonic()
            rec = RequestRecord(
                request_id=item.request_id,
                tenant=item.tenant,
                node=None,
                arrival=sent - t0,
                status="error",
                http_status=0,
                priority_class=item.priority_class,
            )
            records.append(rec)  # recorded before it is sent: nothing can be dropped
            prog.issued += 1
            sender = _Sender(session, target, headers_for, model, t0)
            try:
                await sender.send(item, rec, sent)
            except asyncio.CancelledError:
                rec.status = "error"
                sender.error = "cancelled at the drain deadline"
                raise
            finally:
                if rec.status == "error":
                    msg = sender.error or "unknown"
                    errors[msg] = errors.get(msg, 0) + 1
                last_end = max(last_end, time.monotonic())
                prog.add(rec)
                if on_record is not None:
                    on_record(rec)

        tasks: list[asyncio.Task[None]] = []
        if concurrency is None:
            mode = "open"
            for item in todo:
                at = t0 + item.arrival * arrival_scale
                if deadline is not None and at > deadline:
                    break
                delay = at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(item)))
        else:
            mode = "closed"
            queue = iter(todo)

            async def worker() -> None:
                for item in queue:
                    if deadline is not None and time.monotonic() >= deadline:
                        return
                    await one(item)

            tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
        if tasks:
            if mode == "open":
                wait_s: float | None = drain  # everything is issued already
            elif deadline is None:
                wait_s = None  # workers end when the items run out
            else:
                wait_s = max(0.0, deadline - time.monotonic()) + drain
            _, pending = await asyncio.wait(tasks, timeout=wait_s)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
    return BenchResult(
        records=records,
        issued=prog.issued,
        duration_s=max(last_end - t0, 1e-9),
        mode=mode,
        model=model,
        errors=errors,
    )
