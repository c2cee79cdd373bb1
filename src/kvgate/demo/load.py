"""Replay a request list against the gateway (open loop) and record what each got."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from kvgate.demo.workload import DemoRequest


@dataclass(slots=True)
class RequestRecord:
    tenant: str
    status: int
    ttft_s: float | None = None
    latency_s: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    node: str | None = None
    admission: str | None = None
    error: str | None = None


@dataclass
class LoadProgress:
    total: int
    sent: int = 0
    done: int = 0
    records: list[RequestRecord] = field(default_factory=list)


async def replay(
    gateway_url: str,
    requests: Sequence[DemoRequest],
    api_keys: dict[str, str],
    progress: LoadProgress,
    *,
    request_timeout_s: float = 60.0,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> list[RequestRecord]:
    timeout = aiohttp.ClientTimeout(total=request_timeout_s)
    connector = aiohttp.TCPConnector(limit=256)
    start = time.monotonic()
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def one(req: DemoRequest) -> None:
            delay = start + req.at_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            progress.sent += 1
            record = await _send(session, gateway_url, req, api_keys[req.tenant])
            progress.records.append(record)
            progress.done += 1
            if on_record is not None:
                on_record(record)

        await asyncio.gather(*(one(r) for r in requests))
    return progress.records


async def _send(
    session: aiohttp.ClientSession, url: str, req: DemoRequest, api_key: str
) -> RequestRecord:
    headers = {"Authorization": f"Bearer {api_key}"}
    record = RequestRecord(tenant=req.tenant, status=0)
    sent_at = time.monotonic()
    try:
        async with session.post(
            url + "/v1/chat/completions", json=req.body, headers=headers
        ) as resp:
            record.status = resp.status
            record.node = resp.headers.get("X-KVGate-Node")
            record.admission = resp.headers.get("X-KVGate-Admission")
            if resp.status != 200:
                record.error = (await resp.text())[:200]
                record.latency_s = time.monotonic() - sent_at
                return record
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if record.ttft_s is None and _has_token(chunk):
                    record.ttft_s = time.monotonic() - sent_at
                usage = chunk.get("usage")
                if usage:
                    record.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    record.completion_tokens = int(usage.get("completion_tokens") or 0)
                    details = usage.get("prompt_tokens_details") or {}
                    record.cached_tokens = int(details.get("cached_tokens") or 0)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        record.error = type(exc).__name__
    record.latency_s = time.monotonic() - sent_at
    return record


def _has_token(chunk: dict[str, object]) -> bool:
    for choice in chunk.get("choices") or []:  # type: ignore[attr-defined]
        delta = choice.get("delta") or {}
        if delta.get("content"):
            return True
    return False
