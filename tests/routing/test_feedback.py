from __future__ import annotations

from kvgate.routing.feedback import HitFeedback


def test_consecutive_shortfalls_demote_then_a_hit_restores() -> None:
    fb = HitFeedback(shortfall_fraction=0.5, demote_after=3, demote_on_full_miss=False)
    kw = {"expected_cached_tokens": 100, "prompt_tokens": 120}
    assert fb.record("n1", "k", actual_cached_tokens=40, **kw) is None
    assert fb.record("n1", "k", actual_cached_tokens=90, **kw) is None  # resets the streak
    assert fb.record("n1", "k", actual_cached_tokens=10, **kw) is None
    assert fb.record("n1", "k", actual_cached_tokens=10, **kw) is None
    assert fb.record("n1", "k", actual_cached_tokens=10, **kw) == "demoted"
    assert (
        fb.is_demoted("n1", "k")
        and not fb.is_demoted("n1", "other")
        and not fb.is_demoted("n2", "k")
    )
    assert (
        fb.record("n1", "k", expected_cached_tokens=0, actual_cached_tokens=0, prompt_tokens=120)
        is None
    )
    assert fb.is_demoted("n1", "k")
    assert (
        fb.record("n1", "k", expected_cached_tokens=0, actual_cached_tokens=64, prompt_tokens=120)
        == "restored"
    )
    assert not fb.is_demoted("n1", "k")
    assert fb.nodes["n1"].demotions == 1


def test_full_miss_demotes_at_once() -> None:
    fb = HitFeedback(demote_after=3)
    assert (
        fb.record("n1", "k", expected_cached_tokens=100, actual_cached_tokens=0, prompt_tokens=120)
        == "demoted"
    )


def test_demotion_can_be_disabled_and_unknown_usage_is_ignored() -> None:
    fb = HitFeedback(demote_after=1)
    kw = {"expected_cached_tokens": 100, "prompt_tokens": 120}
    assert fb.record("n1", "k", actual_cached_tokens=None, **kw) is None
    assert "n1" not in fb.nodes
    assert fb.record("n1", "k", actual_cached_tokens=0, demotion_enabled=False, **kw) is None
    assert not fb.is_demoted("n1", "k")
    pair = fb.pair("n1", "k")
    assert pair is not None and pair.ratio_ewma < 1.0


def test_per_node_totals_and_rates() -> None:
    fb = HitFeedback()
    fb.record("n1", "k", expected_cached_tokens=80, actual_cached_tokens=64, prompt_tokens=100)
    fb.record("n1", "j", expected_cached_tokens=0, actual_cached_tokens=0, prompt_tokens=100)
    totals = fb.nodes["n1"]
    assert (totals.requests, totals.predicted_hit_rate, totals.actual_hit_rate) == (2, 0.4, 0.32)


def test_pair_table_is_bounded() -> None:
    fb = HitFeedback(max_entries=10)
    for i in range(50):
        fb.record(
            "n1", f"k{i}", expected_cached_tokens=10, actual_cached_tokens=10, prompt_tokens=20
        )
    assert len(fb._pairs) == 10


def test_hit_rates_stay_rates_when_the_estimate_undercounts() -> None:
    """The router's token estimate (683) below the engine's count (1031, 1024 cached, as a
    real vLLM reported): the node's rates are still <= 1."""
    fb = HitFeedback()
    fb.record("n1", "k", expected_cached_tokens=0, actual_cached_tokens=0, prompt_tokens=683)
    for _ in range(3):
        fb.record(
            "n1", "k", expected_cached_tokens=672, actual_cached_tokens=1024, prompt_tokens=683
        )
    totals = fb.nodes["n1"]
    assert totals.actual_hit_rate is not None and totals.predicted_hit_rate is not None
    assert 0.0 < totals.actual_hit_rate <= 1.0
    assert 0.0 < totals.predicted_hit_rate <= totals.actual_hit_rate
    assert totals.actual_hit_rate == 3 * 1024 / (683 + 3 * 1024)
