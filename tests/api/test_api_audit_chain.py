"""GET /api/v1/audit-chain/verify: the chain over a range, and the first broken link."""

import pytest

from tests.api_support import key_client, make_event
from tests.core.test_audit_chain import sql, trigger_disabled
from tools_app.core import audit

pytestmark = pytest.mark.django_db
VERIFY = "/api/v1/audit-chain/verify"


@pytest.fixture
def chain(tenant, other_tenant):
    """Sealed events of two tenants, interleaved: seq → event."""
    for i in range(6):
        make_event(tenant if i % 2 else other_tenant, object_id=str(i))
    audit.seal()
    return {event.seq: event for event in audit.AuditEvent.objects.filter(seq__isnull=False)}


def test_an_intact_chain_verifies(tenant, chain):
    report = key_client(tenant).get(VERIFY).json()

    assert report["ok"] is True and report["broken"] is None
    assert report["verified"] == report["head_seq"] == max(chain)


def test_a_range_verifies_only_its_links(tenant, chain):
    report = key_client(tenant).get(VERIFY, {"from_seq": 3, "to_seq": 5}).json()

    assert (report["ok"], report["verified"], report["head_seq"]) == (True, 3, 5)
    assert report["head_hash"] == chain[5].hash


def test_a_tampered_row_is_reported_as_the_first_broken_link(tenant, chain):
    victim = next(e for e in chain.values() if e.tenant_id == tenant.pk and e.seq > 2)
    with trigger_disabled():
        sql("UPDATE tools_app_auditevent SET reason = 'nothing to see' WHERE id = %s", [victim.pk])

    report = key_client(tenant).get(VERIFY).json()

    assert report["ok"] is False
    assert report["broken"] == {"seq": victim.seq, "event_id": victim.pk,
                                "problem": "its content was edited after sealing"}
    assert key_client(tenant).get(VERIFY, {"to_seq": victim.seq - 1}).json()["ok"] is True


def test_a_scoped_auditor_learns_the_seq_but_not_another_tenants_event(tenant, other_tenant, chain):
    victim = next(e for e in chain.values() if e.tenant_id == other_tenant.pk and e.seq > 1)
    with trigger_disabled():
        sql("UPDATE tools_app_auditevent SET actor = 'someone else' WHERE id = %s", [victim.pk])

    broken = key_client(tenant).get(VERIFY).json()["broken"]

    assert broken["seq"] == victim.seq and broken["event_id"] is None
    assert "someone else" not in str(broken)


def test_a_range_that_makes_no_sense_is_a_400(tenant, chain):
    assert key_client(tenant).get(VERIFY, {"from_seq": 0}).status_code == 400


def test_without_a_key_verification_is_refused(client, chain):
    assert client.get(VERIFY).status_code == 401
