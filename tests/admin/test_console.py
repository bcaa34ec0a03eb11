"""The console's home and queue pages through Django's test client: queues first, counts, what stands out,
and the queue pages' self-refresh (the poll they make)."""

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.support.api_support import make_record
from tests.support.approvals_support import STAFF_NOTE, call, pending_request
from tests.support.operators import agent_owner, make_operator
from tools_app import access
from tools_app.access.roles import APPROVER, OPERATOR
from tools_app.admin.queues import IDLE, VERSION
from tools_app.models import ApprovalRequest, RecordStatus
from tools_app.toolkit.calls import Caller

HOME = reverse("admin:index")
QUEUE = reverse("admin:tools_app_approvalqueue_changelist")
POLL = reverse("admin:tools_app_approvalqueue_poll")


@pytest.fixture
def olga(client, tenant):
    user = make_operator("olga", OPERATOR, tenant)
    client.force_login(user)
    return user


def ask(caller, key, **overrides) -> ApprovalRequest:
    return pending_request(call(caller, "publish_announcement", idempotency_key=key, **{**STAFF_NOTE, **overrides}))


def test_the_home_page_leads_with_each_queue_its_count_and_oldest_then_the_dashboard(caller, client, olga, tenant):
    old = ask(caller, "a-1")
    ask(caller, "a-2")
    ApprovalRequest.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(hours=3))
    make_record(tenant, tool="request_payment", status=RecordStatus.UNKNOWN)

    response = client.get(HOME)

    queues = {queue.name: (queue.count, oldest) for queue, oldest in response.context["queues"]}
    assert list(queues) == ["Pending approvals", "UNKNOWN outcomes", "Failed or stuck tasks", "Dead-lettered events"]
    assert queues["Pending approvals"] == (2, "3h 0m") and queues["UNKNOWN outcomes"][0] == 1
    assert response.context["glance"]["approvals_waiting"] == 2 and response.context["glance"]["unknown"] == 1
    page = response.content.decode()
    assert page.index('id="queue-1"') < page.index("console-glance") < page.index("console-rest")
    assert "<title>Work queues | idemops console</title>" in page
    assert [app["name"] for app in response.context["app_list"]] == [
        "Look into", "Reference data", "Business objects (demo)"]


def test_every_page_shows_the_queues_first_in_its_navigation_with_their_counts(caller, client, olga):
    ask(caller, "a-1")

    page = client.get(reverse("admin:tools_app_idempotencyrecord_changelist"))

    sections = [app["name"] for app in page.context["available_apps"]]
    assert sections[:2] == ["Work queues", "Look into"]
    assert '<span class="queue-badge busy" id="badge-approvalqueue" title="1 waiting">1</span>' in (
        page.content.decode())


def test_counts_cover_only_the_tenants_a_person_may_see(caller, client, other_tenant):
    ask(caller, "a-1")
    ask(Caller(tenant_id=other_tenant.pk, actor="agent:globex/test"), "a-1")
    client.force_login(make_operator("gina", APPROVER, other_tenant))

    response = client.get(HOME)

    assert [(queue.name, queue.count) for queue, _ in response.context["queues"]] == [("Pending approvals", 1)]


def test_an_escalated_request_stands_out_in_the_queue_and_on_the_home_page(caller, client, olga):
    ask(caller, "a-1")
    escalated = ask(caller, "a-2")
    ApprovalRequest.objects.filter(pk=escalated.pk).update(escalated_at=timezone.now())

    home = client.get(HOME)
    queue = client.get(QUEUE)
    only = client.get(QUEUE, {"escalated_at__isnull": "False"})

    [(approvals, _), *_] = home.context["queues"]
    assert (approvals.count, approvals.stands_out, approvals.stands_out_label) == (2, 1, "escalated")
    flags = [row.stands_out for row in queue.context["cl"].result_list]
    assert flags == [False, True] and queue.content.decode().count('class="stands-out"') == 1
    assert [row.pk for row in only.context["cl"].result_list] == [escalated.pk]


def test_a_queue_page_says_what_to_do_and_polls_with_its_own_filters(caller, client, olga):
    ask(caller, "a-1")

    page = client.get(QUEUE, {"tool": "publish_announcement"})

    body = page.content.decode()
    assert "What to do here:" in body and "Approve or Reject" in body
    assert f'hx-get="{POLL}?tool=publish_announcement&amp;{VERSION}=' in body
    assert 'hx-trigger="every 10.0s"' in body and "htmx" in body


def poll(client, page, idle: bool):
    """What the page's htmx poll asks: its own query string, plus whether the operator is idle."""
    return client.get(f"{POLL}?{page.context_data['poll_query']}&{IDLE}={'1' if idle else '0'}")


def test_the_poll_is_silent_until_the_queue_changes_then_refreshes_an_idle_page_and_tells_a_busy_one(
        caller, client, olga):
    ask(caller, "a-1")
    page = client.get(QUEUE, {"tool": "publish_announcement"})

    unchanged = poll(client, page, idle=True)
    ask(caller, "a-2")
    idle = poll(client, page, idle=True)
    busy = poll(client, page, idle=False)

    assert unchanged.status_code == 204
    assert idle.status_code == 200 and idle["HX-Refresh"] == "true"
    assert busy.status_code == 200 and "HX-Refresh" not in busy and "changed since the page was loaded (2 now)" in (
        busy.content.decode())


def test_the_poll_ignores_what_the_pages_filters_leave_out(caller, client, olga):
    ask(caller, "a-1")
    order = call(caller, "create_order", idempotency_key="o-1", customer="ACME", currency="EUR",
                 items=[{"sku": "BOLT-1", "quantity": 1, "unit_price": "2.50"}]).result["order_id"]
    page = client.get(QUEUE, {"tool": "publish_announcement"})

    ask(caller, "a-1")  # no change: the same key and arguments are the same request
    deletion = pending_request(call(caller, "delete_record", idempotency_key="d-1", kind="order", id=order,
                                    reason="cleanup"))  # another tool: filtered out

    assert deletion.tool == "delete_record" and ApprovalRequest.objects.count() == 2
    assert poll(client, page, idle=True).status_code == 204


def test_an_idle_page_is_drawn_again_once_its_ages_are_a_minute_old(caller, client, olga):
    ask(caller, "a-1")
    page = client.get(QUEUE)
    query = re.sub(r"_drawn=\d+", "_drawn=1", page.context_data["poll_query"])  # drawn long ago

    assert client.get(f"{POLL}?{query}&{IDLE}=1")["HX-Refresh"] == "true"
    assert client.get(f"{POLL}?{query}&{IDLE}=0").status_code == 204  # busy: not for ages alone


def test_the_poll_is_refused_without_the_queues_permission(client, tenant):
    client.force_login(make_operator("aud", "auditor", tenant))

    assert client.get(POLL).status_code == 403


def test_the_token_list_names_each_agents_owner_and_filters_by_them(client, tenant, django_user_model):
    bob = agent_owner("bob")
    carol = agent_owner("carol")
    access.issue_token(tenant, "billing-agent", owner=bob)
    access.issue_token(tenant, "support-agent", owner=carol)
    client.force_login(django_user_model.objects.create_superuser("root", "root@example.invalid", "x"))

    page = client.get(reverse("admin:tools_app_apitoken_changelist"), {"owner__id__exact": bob.pk}).content.decode()

    assert "billing-agent" in page and ">bob<" in page
    assert "support-agent" not in page
