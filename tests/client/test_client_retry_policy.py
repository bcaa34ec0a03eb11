"""Which answers are asked again, and how long the client waits in between."""

import random

import pytest

from idemops_client import RetryPolicy, is_retryable
from tools_app.core.errors import ErrorClass


@pytest.mark.parametrize("error_class", ["transient", "in_progress", "unknown_outcome", "pending_approval",
                                         "rate_limited", "transport", "unavailable"])
def test_answers_that_may_change_are_retried(error_class):
    assert is_retryable(error_class, None)


@pytest.mark.parametrize("error_class", ["invalid_input", "permission_denied", "conflict", "not_found", "expired",
                                         "already_done", "downstream_conflict", "internal_error", "unauthorized",
                                         "protocol_error"])
def test_deterministic_answers_are_never_retried_even_with_a_retry_after(error_class):
    assert not is_retryable(error_class, None)
    assert not is_retryable(error_class, 5.0)


def test_a_class_the_client_does_not_know_is_retried_only_when_the_server_says_when():
    assert is_retryable("quota_paused", 3.0)
    assert not is_retryable("quota_paused", None)


def test_every_class_the_server_defines_has_a_decided_rule():
    from idemops_client.errors import DETERMINISTIC, RETRYABLE

    assert {str(c) for c in ErrorClass} <= RETRYABLE | DETERMINISTIC


def test_backoff_is_full_jitter_exponential_and_capped():
    policy = RetryPolicy(base_delay=0.5, max_delay=4.0)
    rng = random.Random(7)
    for attempt in range(1, 10):
        ceiling = min(4.0, 0.5 * 2 ** (attempt - 1))
        waits = [policy.delay(attempt, None, rng) for _ in range(200)]
        assert all(0 <= w <= ceiling for w in waits)
        assert max(waits) > ceiling * 0.8 and min(waits) < ceiling * 0.2  # spread over the whole range


def test_a_retry_after_is_a_floor_spread_by_at_most_a_tenth():
    policy = RetryPolicy(base_delay=0.1, max_delay=0.2)
    rng = random.Random(3)
    waits = [policy.delay(1, 2.0, rng) for _ in range(200)]

    assert all(2.0 <= w <= 2.2 for w in waits)
    assert len({round(w, 6) for w in waits}) > 100


@pytest.mark.parametrize("bad", [{"max_attempts": 0}, {"max_seconds": 0}, {"attempt_timeout": -1}])
def test_a_budget_that_allows_nothing_is_refused(bad):
    with pytest.raises(ValueError):
        RetryPolicy(**bad)
