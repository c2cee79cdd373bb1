"""``kvgate calibrate``: find an engine's latency knee and write its capacity profile."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from kvgate.adapters import ENGINE_TYPES
from kvgate.cli import UsageError

DESCRIPTION = """\
Drive a stepped, closed-loop concurrency ramp of streamed completions at one context
length against ONE engine (not the gateway), read the engine's own /metrics as it goes,
find the latency knee and write the capacity profile

  {model_version, deployment, context, capacity_runtime_tokens, knee_concurrency,
   ttft_p99_at_knee, measured_at}

to a YAML file and (with --store) to /kvgate/capacity/<model_version>/<deployment>.
The knee is the last step before the first step past it: more than 5% failed
requests or p99 TTFT/TPOT above the SLO (final at once); or, confirmed by the next step,
p99 TTFT above --ttft-factor x the median p99 of the earlier steps, mean TTFT above
1.5 x their median, throughput rising by less than a quarter of the concurrency step,
or engine preemptions (docs/operations.md, "Capacity calibration"). Latency comes
from the engine's TTFT histogram when it has one (vLLM, SGLang, engine-sim), else from
the client.
capacity_runtime_tokens is the engine's KV tokens in use (+ queued prompt tokens),
averaged over the knee step. The ramp is bounded by --max-requests and --max-seconds.
Exit status: 0 profile written; 1 no knee within the bounds, or the engine does not
answer; 2 bad arguments.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = DESCRIPTION
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--target", required=True, help="engine base URL, e.g. http://127.0.0.1:8001")
    p.add_argument(
        "--engine-type",
        default="vllm",
        choices=ENGINE_TYPES,
        help="which metrics adapter reads the engine's /metrics (default vllm)",
    )
    p.add_argument("--model", default=None, help="model name to request (default: /v1/models)")
    p.add_argument(
        "--model-version",
        default="",
        help="model version the profile is kept under (default: the served model name)",
    )
    p.add_argument(
        "--deployment",
        default="default",
        help="deployment shape the profile is kept under, e.g. h100x1-tp1 (default 'default')",
    )
    p.add_argument(
        "--context",
        type=int,
        default=1024,
        help="tokens per request, prompt + output (use the deployment's max context; default 1024)",
    )
    p.add_argument(
        "--output-tokens",
        type=int,
        default=64,
        help="forced output tokens per request (default 64)",
    )
    p.add_argument(
        "--slo-ttft-p99", type=float, default=None, help="p99 TTFT SLO in seconds (optional)"
    )
    p.add_argument(
        "--slo-tpot-p99", type=float, default=None, help="p99 TPOT SLO in seconds (optional)"
    )
    p.add_argument(
        "--ttft-factor",
        type=float,
        default=4.0,
        help="p99 TTFT above this x the flat-region floor is past the knee (default 4: above "
        "the 2.5x steps of vLLM's TTFT histogram buckets)",
    )
    p.add_argument("--start", type=int, default=1, help="first concurrency (default 1)")
    p.add_argument(
        "--growth", type=float, default=1.35, help="concurrency growth per step (default 1.35)"
    )
    p.add_argument("--max-concurrency", type=int, default=256, help="ramp ceiling (default 256)")
    p.add_argument(
        "--step-requests",
        type=int,
        default=24,
        help="measured completions per step, at least 2 x concurrency (default 24)",
    )
    p.add_argument(
        "--step-seconds", type=float, default=60.0, help="cap on one step's measuring (default 60)"
    )
    p.add_argument(
        "--max-requests", type=int, default=3000, help="requests for the whole ramp (default 3000)"
    )
    p.add_argument(
        "--max-seconds", type=float, default=600.0, help="time for the whole ramp (default 600)"
    )
    p.add_argument(
        "--refine", type=int, default=3, help="bisection steps around the knee (default 3)"
    )
    p.add_argument("--out", default=None, help="write the profile as YAML to this file")
    p.add_argument("--plot", default=None, help="write a PNG of latency/throughput vs concurrency")
    p.add_argument(
        "--store", default=None, help="also write the profile to this store (etcd://…, redis://…)"
    )
    p.add_argument("--steps-json", default=None, help="write every step's measurements as JSON")
    p.add_argument("--seed", type=int, default=0, help="prompt/output-length RNG seed (default 0)")


def _check(args: argparse.Namespace) -> None:
    if args.context < 2:
        raise UsageError("--context must be >= 2")
    if not 1 <= args.output_tokens < args.context:
        raise UsageError("--output-tokens must be >= 1 and below --context")
    if args.start < 1 or args.max_concurrency < args.start:
        raise UsageError("--start must be >= 1 and <= --max-concurrency")
    if args.growth <= 1.0:
        raise UsageError("--growth must be > 1")
    if args.ttft_factor <= 1.0:
        raise UsageError("--ttft-factor must be > 1")
    if (
        min(args.step_requests, args.max_requests) < 1
        or min(args.step_seconds, args.max_seconds) <= 0
    ):
        raise UsageError(
            "--step-requests, --max-requests, --step-seconds, --max-seconds must be > 0"
        )


def run(args: argparse.Namespace) -> int:
    from kvgate.calibrate import NoKnee, RampConfig, calibrate
    from kvgate.calibrate.knee import KneeRule
    from kvgate.calibrate.ramp import EngineUnreachable

    _check(args)
    config = RampConfig(
        target=args.target.rstrip("/").removesuffix("/v1"),
        engine_type=args.engine_type,
        context=args.context,
        output_tokens=args.output_tokens,
        model=args.model,
        start=args.start,
        growth=args.growth,
        max_concurrency=args.max_concurrency,
        step_requests=args.step_requests,
        step_seconds=args.step_seconds,
        max_requests=args.max_requests,
        max_seconds=args.max_seconds,
        refine=args.refine,
        seed=args.seed,
        rule=KneeRule(
            ttft_factor=args.ttft_factor,
            slo_ttft_p99=args.slo_ttft_p99,
            slo_tpot_p99=args.slo_tpot_p99,
        ),
    )
    try:
        profile, result = asyncio.run(
            calibrate(config, model_version=args.model_version, deployment=args.deployment)
        )
    except EngineUnreachable as exc:
        print(f"kvgate calibrate: {exc}", file=sys.stderr)
        return 1
    except NoKnee as exc:
        _print_steps(exc.result)
        _outputs(args, exc.result)
        print(str(exc), file=sys.stderr)
        return 1
    _print_steps(result)
    _outputs(args, result, f"{profile.model_version} @ {profile.deployment}")
    if args.out:
        Path(args.out).write_text(profile.to_yaml())
    if args.store:
        asyncio.run(_store_profile(args.store, profile))
    print(profile.to_yaml(), end="")
    return 0


def _outputs(args: argparse.Namespace, result: object, name: str = "") -> None:
    from kvgate.calibrate.plot import write_plot
    from kvgate.calibrate.ramp import RampResult

    assert isinstance(result, RampResult)
    if args.plot and result.steps:
        title = f"kvgate calibrate: {name or result.model}, context {result.config.context}"
        write_plot(result, args.plot, title)
    if args.steps_json:
        Path(args.steps_json).write_text(
            json.dumps([s.to_dict() for s in result.steps], indent=1, default=str)
        )


def _print_steps(result: object) -> None:
    from kvgate.calibrate.ramp import RampResult

    assert isinstance(result, RampResult)
    print(
        f"{'conc':>5} {'reqs':>5} {'err':>4} {'ttft_p99':>9} {'tpot_p99':>9} "
        f"{'tok/s':>8} {'runtime_tok':>11} {'kv':>5} {'wait':>5}",
        file=sys.stderr,
    )
    knee = result.knee_step
    for s in result.steps:
        kv = f"{s.kv_usage:5.2f}" if s.kv_usage is not None else "    -"
        mark = "  <- knee" if knee is not None and s is knee else ""
        print(
            f"{s.concurrency:5d} {s.requests:5d} {s.errors:4d} {s.ttft_p99:9.4f} "
            f"{s.tpot_p99:9.4f} {s.throughput:8.1f} {s.runtime_tokens:11.0f} {kv} "
            f"{s.waiting:5.1f}{mark}" + (f"  errors: {s.error_kinds}" if s.error_kinds else ""),
            file=sys.stderr,
        )


async def _store_profile(url: str, profile: object) -> None:
    from kvgate.calibrate.profile import CapacityProfile
    from kvgate.store import open_store

    assert isinstance(profile, CapacityProfile)
    store = open_store(url)
    try:
        await store.put(profile.key, profile.to_json())
    finally:
        await store.close()
