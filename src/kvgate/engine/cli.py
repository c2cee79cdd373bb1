"""``kvgate engine-sim``: N simulated OpenAI-compatible engines in one process."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

import zmq
from aiohttp import web

from kvgate.engine.profiles import PROFILES, get_profile
from kvgate.engine.server import EngineServer
from kvgate.kv_events.publisher import KvEventPublisher, offset_endpoint
from kvgate.kv_events.tokenizer import PromptHasher
from kvgate.tasks import stop_on_signals

log = logging.getLogger("kvgate.engine")


# The options that override the profile's engine limits (``Profile.with_overrides``).
LIMITS = {
    "kv_blocks": "KV cache blocks of 16 tokens",
    "max_num_seqs": "running sequences cap",
    "max_num_batched_tokens": "tokens per scheduler step",
    "max_model_len": "longest prompt + output",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="bind address")
    parser.add_argument("--port", type=int, default=8000, help="port of a single engine")
    parser.add_argument("--count", type=int, default=1, help="engines to host in this process")
    parser.add_argument(
        "--base-port",
        type=int,
        default=None,
        help="first port with --count; engine i listens on base+i (0: free ports)",
    )
    parser.add_argument(
        "--profile",
        default="gemma3-270m-cpu",
        choices=sorted(PROFILES),
        help="engine timing and KV model (docs/engine-model.md)",
    )
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="simulated time runs X times faster"
    )
    parser.add_argument("--model", default=None, help="served model name (default: profile's)")
    for name, what in LIMITS.items():
        option = "--" + name.replace("_", "-")
        parser.add_argument(option, type=int, default=None, help=f"{what} (default: profile's)")
    parser.add_argument(
        "--decode-ms-per-token",
        type=float,
        default=None,
        help="replace the profile's decode step: this many ms per token at batch 1, "
        "+0.5%% per extra running sequence",
    )
    parser.add_argument(
        "--prefill-tokens-per-s",
        type=float,
        default=None,
        help="replace the profile's prompt compute: uncached prompt tokens per second",
    )
    parser.add_argument(
        "--port-file", default=None, help="write the bound ports here, one a line, when ready"
    )
    parser.add_argument(
        "--kv-events-endpoint",
        default=None,
        help="publish KV cache events (vLLM wire format) on this ZMQ PUB endpoint, e.g. "
        "tcp://127.0.0.1:5557; engine i of --count adds i to the port",
    )
    parser.add_argument(
        "--kv-events-replay-endpoint",
        default=None,
        help="ZMQ ROUTER endpoint serving missed event batches, e.g. tcp://127.0.0.1:5657",
    )
    parser.add_argument("--kv-events-topic", default="", help="topic frame of each message")
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer.json: key the KV cache by its token ids hashed as vLLM does "
        "(sha256_cbor chain) instead of kvgate's text model",
    )
    parser.add_argument(
        "--hash-seed",
        default=os.environ.get("PYTHONHASHSEED", "0"),
        help="vLLM's NONE_HASH seed (its PYTHONHASHSEED; default: $PYTHONHASHSEED or 0)",
    )
    parser.add_argument(
        "--hash-algo",
        default="sha256_cbor",
        choices=("sha256_cbor", "xxhash_cbor"),
        help="block hash of --tokenizer keys (vLLM's --prefix-caching-hash-algo)",
    )


def _validate(args: argparse.Namespace) -> str | None:
    if args.count < 1:
        return "--count must be >= 1"
    if args.time_scale <= 0:
        return "--time-scale must be > 0"
    for name in LIMITS:
        value = getattr(args, name)
        if value is not None and value < 1:
            return f"--{name.replace('_', '-')} must be >= 1"
    for name in ("decode_ms_per_token", "prefill_tokens_per_s"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            return f"--{name.replace('_', '-')} must be > 0"
    if args.kv_events_replay_endpoint and not args.kv_events_endpoint:
        return "--kv-events-replay-endpoint needs --kv-events-endpoint"
    return None


def _ports(args: argparse.Namespace) -> list[int]:
    if args.base_port is None:
        if args.count == 1:
            return [args.port]
        return [args.port + i for i in range(args.count)]
    if args.base_port == 0:
        return [0] * args.count
    return [args.base_port + i for i in range(args.count)]


def _publisher(args: argparse.Namespace, i: int) -> KvEventPublisher | None:
    if not args.kv_events_endpoint:
        return None
    replay = args.kv_events_replay_endpoint
    return KvEventPublisher(
        offset_endpoint(args.kv_events_endpoint, i),
        replay_endpoint=offset_endpoint(replay, i) if replay else None,
        topic=args.kv_events_topic,
    )


async def _serve(args: argparse.Namespace) -> int:
    profile = get_profile(args.profile).with_overrides(
        **{n: getattr(args, n) for n in LIMITS},
        decode_ms_per_token=args.decode_ms_per_token,
        prefill_tokens_per_s=args.prefill_tokens_per_s,
    )
    hasher = None
    if args.tokenizer:
        hasher = PromptHasher(
            args.tokenizer, block_size=profile.block_size, algo=args.hash_algo, seed=args.hash_seed
        )
    servers = [
        EngineServer(
            profile,
            model_name=args.model,
            engine_index=i,
            time_scale=args.time_scale,
            kv_events=_publisher(args, i),
            prompt_hasher=hasher,
        )
        for i in range(args.count)
    ]
    runners: list[web.AppRunner] = []
    bound: list[int] = []
    try:
        for server, port in zip(servers, _ports(args), strict=True):
            runner = web.AppRunner(
                server.make_app(),
                access_log=None,
                handle_signals=False,
                shutdown_timeout=5.0,
                handler_cancellation=True,  # a caller that leaves aborts its request
            )
            await runner.setup()
            runners.append(runner)
            site = web.TCPSite(runner, args.host, port, reuse_address=True)
            await site.start()
            sockets = site._server.sockets if site._server else ()  # type: ignore[union-attr,attr-defined]
            bound.append(sockets[0].getsockname()[1] if sockets else port)
        p = servers[0].profile
        log.info(
            "engine-sim: %d engine(s) profile=%s model=%s ports=%s kv_blocks=%d time_scale=%g",
            len(servers), p.name, servers[0].model_name, bound, p.num_gpu_blocks, args.time_scale,
        )  # fmt: skip
        if args.port_file:
            tmp = Path(args.port_file + ".tmp")
            tmp.write_text("".join(f"{port}\n" for port in bound))
            os.replace(tmp, args.port_file)
        stop = stop_on_signals()
        await stop.wait()
        log.info("engine-sim: shutting down")
        for server in servers:
            server.fail_pending(503, "engine shutting down")
    finally:
        results = await asyncio.gather(*(r.cleanup() for r in runners), return_exceptions=True)
        for exc in results:
            if isinstance(exc, Exception):
                log.warning("engine-sim: cleanup failed: %s", exc)
    return 0


def run(args: argparse.Namespace) -> int:
    error = _validate(args)
    if error:
        print(f"kvgate engine-sim: {error}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        return asyncio.run(_serve(args))
    except (OSError, ValueError, zmq.ZMQError) as exc:  # a taken port, a bad tokenizer file
        print(f"kvgate engine-sim: {exc}", file=sys.stderr)
        return 1
