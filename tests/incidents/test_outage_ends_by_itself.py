"""Issue 36: a downstream outage ends by itself. The payment gateway answers 503 "nothing done" for
60 s, then commits payments without answering for 30 s, then recovers, while ten agents keep paying
(tests/support/incident.py): no payment twice, nothing left for a person, every key done within 60 s of the
recovery, and the open breaker spares the gateway most of the agents' retries."""

import pytest

from tests.support import incident
from tests.support.processes import Stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stack = incident.stack(tmp_path_factory.mktemp("incident"))
    yield stack
    stack.stop()


def test_a_sixty_second_outage_then_silent_commits_leave_nothing_for_a_person_and_every_key_completes(
        stack: Stack):
    # when: the outage runs its course under ten agents
    report = incident.run(stack, before=5, outage=60, hang=30)

    # then: one payment per operation, every one the agents started
    assert report.duplicate_operations == 0
    assert report.unfinished == [], f"keys never completed: {report.last_answers[:5]}"
    assert report.gateway_payments == len(report.payments)
    # nothing for a person: no record escalated, none UNKNOWN, none given up as not executed
    assert (report.escalated, report.unknown_left, report.not_executed) == (0, 0, 0)
    # every key completes within 60 s of the recovery
    assert report.slowest_after_recovery <= 60, report.slowest_after_recovery
    # the breaker answered for the gateway: retries held back without running outnumber what reached it
    assert report.held_answers > 0
    assert report.gateway_posts < sum(len(p.answers) for p in report.payments)
