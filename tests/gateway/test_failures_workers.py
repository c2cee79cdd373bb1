"""Failure handling with ``--workers 2``: the owner's one pipeline decides for both workers.

The same tests as ``test_failures`` (imported, so they cannot drift), run with two proxy
worker processes: retries go through the ``failed``/``next`` messages, ejection and the
retry budget are the owner's, a client that leaves cancels its queue entry at the owner
(``cancel``) and its upstream request in the worker, and every release reaches the
owner's one admission ledger.

Left out: ``test_client_disconnect_mid_stream_releases_everything`` polls the in-flight
gauge, a worker's metric that reaches the owner with a push (20 ms after the worker goes
idle): the gauge reads 0 before the request's first push, so the test's wait ends at once.
"""

from __future__ import annotations

from tests.gateway.test_failures import (
    test_clients_that_leave_cost_nothing,
    test_engine_answer_about_the_request_is_relayed_not_retried,
    test_engine_death_mid_stream_ends_with_sse_error,
    test_hung_engine_costs_at_most_first_byte_timeout_plus_one_retry,
    test_killed_engine_is_ejected_at_once_and_probed_back,
    test_killed_engine_loses_no_unary_request,
    test_retries_flag_off_gives_502_at_once,
    test_three_of_four_dead_the_healthy_one_serves_everything,
)

__all__ = [
    "test_clients_that_leave_cost_nothing",
    "test_engine_answer_about_the_request_is_relayed_not_retried",
    "test_engine_death_mid_stream_ends_with_sse_error",
    "test_hung_engine_costs_at_most_first_byte_timeout_plus_one_retry",
    "test_killed_engine_is_ejected_at_once_and_probed_back",
    "test_killed_engine_loses_no_unary_request",
    "test_retries_flag_off_gives_502_at_once",
    "test_three_of_four_dead_the_healthy_one_serves_everything",
]
