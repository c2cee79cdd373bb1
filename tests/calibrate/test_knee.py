"""The knee rule, the histogram delta quantile and the profile document (pure)."""

from __future__ import annotations

import pytest

from kvgate.adapters.prom import parse_metrics
from kvgate.calibrate.analytic import analytic_capacity
from kvgate.calibrate.histogram import buckets, delta_mean, delta_quantile
from kvgate.calibrate.knee import KneeRule, StepStats, find_knee
from kvgate.calibrate.profile import CapacityProfile, ProfileError, parse_profile_key, profile_key
from kvgate.engine.profiles import get_profile


def steps(rows: list[tuple[int, float, float, float]]) -> list[StepStats]:
    """(concurrency, ttft p99, ttft mean, throughput)."""
    return [StepStats(c, p99, 0.01, thr, mean) for c, p99, mean, thr in rows]


def test_knee_is_the_last_step_before_a_confirmed_jump() -> None:
    knee = find_knee(
        steps(
            [
                (1, 0.10, 0.05, 100),
                (2, 0.11, 0.05, 190),
                (4, 0.12, 0.06, 360),
                (6, 0.90, 0.40, 380),
                (8, 1.80, 0.90, 381),
            ]
        ),
        KneeRule(),
    )
    assert (knee.index, knee.past_index, knee.reason) == (2, 3, "ttft_p99_left_flat")
    assert knee.confirmed


def test_a_lone_outlier_is_noise_and_a_last_step_hit_is_unconfirmed() -> None:
    rows = [(1, 0.10, 0.05, 100), (2, 0.90, 0.05, 190), (4, 0.12, 0.06, 360)]
    assert not find_knee(steps(rows), KneeRule()).reached
    unconfirmed = find_knee(steps([*rows, (6, 2.0, 1.0, 400)]), KneeRule())
    assert unconfirmed.reached and not unconfirmed.confirmed and unconfirmed.index == 2


def test_throughput_that_stops_rising_is_a_knee() -> None:
    rows = [(1, 0.1, 0.05, 100), (2, 0.1, 0.05, 200), (4, 0.1, 0.05, 390), (6, 0.1, 0.05, 395)]
    knee = find_knee(steps([*rows, (8, 0.1, 0.05, 396)]), KneeRule())
    assert (knee.index, knee.reason) == (2, "throughput_flat")


def test_slo_breach_is_final_at_once() -> None:
    rows = [(1, 0.1, 0.05, 100), (2, 0.3, 0.06, 200), (4, 0.1, 0.05, 400)]
    knee = find_knee(steps(rows), KneeRule(slo_ttft_p99=0.25))
    assert (knee.index, knee.past_index, knee.reason, knee.confirmed) == (0, 1, "slo_ttft", True)
    first_bad = find_knee(steps(rows[:1]), KneeRule(slo_ttft_p99=0.05))
    assert first_bad.index == -1 and first_bad.reached


def test_preemptions_mark_a_full_kv_cache() -> None:
    flat = [StepStats(c, 0.1, 0.01, 100.0 * c, 0.05) for c in (1, 2, 3)]
    bad = [StepStats(c, 0.1, 0.01, 100.0 * c, 0.05, preemptions=3) for c in (4, 5)]
    knee = find_knee(flat + bad, KneeRule())
    assert (knee.index, knee.reason) == (2, "preempting")


HIST = """# TYPE x histogram
x_bucket{{le="0.1"}} {a}
x_bucket{{le="1.0"}} {b}
x_bucket{{le="+Inf"}} {c}
x_sum {s}
x_count {c}
"""


def test_delta_quantile_and_mean_use_only_the_observations_in_between() -> None:
    before = parse_metrics(HIST.format(a=10, b=10, c=10, s=0.5))
    after = parse_metrics(HIST.format(a=10, b=110, c=110, s=50.5))
    b0, b1 = buckets(before, ("x",)), buckets(after, ("x",))
    # 100 new observations, all in (0.1, 1.0]: p50 interpolates to the bucket middle
    assert delta_quantile(b0, b1, 0.5) == pytest.approx(0.55)
    assert delta_quantile(b0, b1, 0.99) == pytest.approx(0.991)
    assert delta_mean(before, after, ("x",)) == pytest.approx(0.5)
    assert delta_quantile(b1, b1, 0.99) is None  # nothing observed


def test_analytic_capacity_follows_the_binding_limit() -> None:
    kv_bound = get_profile("llama3-8b-h100").with_overrides(kv_blocks=1024)
    a = analytic_capacity(kv_bound, context=1024, output_tokens=128)
    assert (a.concurrency, a.bound, a.runtime_tokens) == (16, "kv_cache", 16 * 960)
    seq_bound = get_profile("llama3-8b-h100").with_overrides(max_num_seqs=8)
    b = analytic_capacity(seq_bound, context=1024, output_tokens=128)
    assert (b.concurrency, b.bound) == (8, "max_num_seqs")


def test_profile_round_trips_and_names_bad_fields() -> None:
    p = CapacityProfile("google/gemma-3-270m-it", "cpu-1t", 512, 4000, 8, 1.5, 1.0e9)
    assert CapacityProfile.from_json(p.to_json()) == p
    assert parse_profile_key(p.key) == ("google/gemma-3-270m-it", "cpu-1t")
    assert p.key == profile_key("google/gemma-3-270m-it", "cpu-1t")
    assert "/gemma" not in p.key  # the model's "/" is quoted: one key level per part
    with pytest.raises(ProfileError, match="capacity_runtime_tokens"):
        CapacityProfile.from_dict({**p.to_dict(), "capacity_runtime_tokens": 0})
    with pytest.raises(ProfileError, match="knee_concurrency: field required"):
        data = p.to_dict()
        del data["knee_concurrency"]
        CapacityProfile.from_dict(data)


def test_failing_requests_end_the_ramp_at_once() -> None:
    ok = [StepStats(c, 0.1, 0.01, 100.0 * c, 0.05) for c in (1, 2)]
    bad = StepStats(3, 0.1, 0.01, 300.0, 0.05, error_rate=0.5)
    knee = find_knee([*ok, bad], KneeRule())
    assert (knee.index, knee.reason, knee.confirmed) == (1, "errors", True)
    first = find_knee([StepStats(1, 0.0, 0.0, 0.0, 0.0, error_rate=1.0)], KneeRule())
    assert (first.index, first.reason) == (-1, "errors")
