"""GET /api/v1/audit-chain/verify: the chain over a range, and the first broken link."""

import pytest

from tests.core.test_audit_chain import sql, trigger_disabled
from tests.support.api_support import key_client, make_event
from tools_app.conf import override_conf
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


# --- pages ---------------------------------------------------------------------------


def walk(client, **params):
    """Follow `next` from the first page to the last: the answers, in order."""
    pages = [client.get(VERIFY, params).json()]
    while pages[-1]["next"] is not None:
        pages.append(client.get(VERIFY, {"cursor": pages[-1]["next"]}).json())
    return pages


def test_one_request_checks_at_most_a_page_and_its_cursor_continues_the_walk(tenant, chain, settings):
    override_conf(settings, audit_verify_page_events=2)
    head = max(chain)

    pages = walk(key_client(tenant))

    assert [page["verified"] for page in pages] == [2] * (head // 2) + ([head % 2] if head % 2 else [])
    assert [page["head_seq"] for page in pages] == [min(n, head) for n in range(2, head + 2, 2)]
    assert all(page["ok"] for page in pages) and pages[-1]["head_hash"] == chain[head].hash


def test_the_cursor_keeps_the_range_it_was_given(tenant, chain, settings):
    override_conf(settings, audit_verify_page_events=2)

    pages = walk(key_client(tenant), from_seq=2, to_seq=6, limit=2)

    assert [page["head_seq"] for page in pages] == [3, 5, 6] and pages[-1]["head_hash"] == chain[6].hash


def test_a_tampered_row_is_found_on_the_page_that_holds_it(tenant, chain, settings):
    override_conf(settings, audit_verify_page_events=2)
    with trigger_disabled():
        sql("UPDATE tools_app_auditevent SET object_id = 'x' WHERE seq = 5")

    pages = walk(key_client(tenant))

    assert [page["ok"] for page in pages] == [True, True, False]
    assert pages[-1]["broken"]["seq"] == 5 and pages[-1]["next"] is None


def test_a_link_rewritten_across_two_pages_is_found(tenant, chain, settings):
    """The next page starts from the hash the previous page computed, not from what the table says now."""
    override_conf(settings, audit_verify_page_events=2)
    client = key_client(tenant)
    first = client.get(VERIFY).json()
    with trigger_disabled():  # seq 2 rewritten after the first page checked it, seq 3 relinked to it
        sql("UPDATE tools_app_auditevent SET hash = %s WHERE seq = 2", ["e" * 64])
        sql("UPDATE tools_app_auditevent SET prev_hash = %s WHERE seq = 3", ["e" * 64])

    second = client.get(VERIFY, {"cursor": first["next"]}).json()

    assert second["ok"] is False and second["broken"]["seq"] == 3 and "link" in second["broken"]["problem"]


def test_a_limit_above_the_most_a_request_may_check_is_a_400(tenant, chain, settings):
    override_conf(settings, audit_verify_page_events=2)

    answer = key_client(tenant).get(VERIFY, {"limit": 3})

    assert answer.status_code == 400 and "at most 2 events per request" in str(answer.json())


@pytest.mark.parametrize("bad", ["not-a-cursor", "edited"])
def test_a_cursor_the_server_did_not_issue_is_a_400_with_a_clear_error(tenant, chain, settings, bad):
    override_conf(settings, audit_verify_page_events=2)
    client = key_client(tenant)
    cursor = client.get(VERIFY).json()["next"]
    if bad == "edited":  # the payload changed, the signature kept
        payload, _, signature = cursor.partition(":")
        cursor = payload[:-1] + ("A" if payload[-1] != "A" else "B") + ":" + signature

    answer = client.get(VERIFY, {"cursor": cursor if bad == "edited" else bad})

    assert answer.status_code == 400 and "not a cursor this server issued" in str(answer.json())
