"""Failure handling with ``--workers 2``: the owner's one pipeline decides for both workers.

The same tests as ``test_failures`` (imported, so they cannot drift), run with two proxy
worker processes: retries go through the ``failed``/``next`` messages, ejection and the
retry budget are the owner's, a client that leaves cancels its queue entry at the owner
(``cancel``) and its upstream request in the worker, and every release reaches the
owner's one admission ledger.
"""

from __future__ import annotations

from tests.gateway.test_failures import (
    test_clients_that_leave_cost_nothing,
    test_engine_answer_about_the_request_is_relayed_not_retried,
    test_engine_death_mid_stream_ends_with_sse_error,
    test_killed_engine_is_ejected_at_once_and_probed_back,
    test_killed_engine_loses_no_unary_request,
    test_retries_flag_off_gives_502_at_once,
    test_three_of_four_dead_the_healthy_one_serves_everything,
)

__all__ = [
    "test_clients_that_leave_cost_nothing",
    "test_engine_answer_about_the_request_is_relayed_not_retried",
    "test_engine_death_mid_stream_ends_with_sse_error",
    "test_killed_engine_is_ejected_at_once_and_probed_back",
    "test_killed_engine_loses_no_unary_request",
    "test_retries_flag_off_gives_502_at_once",
    "test_three_of_four_dead_the_healthy_one_serves_everything",
]
