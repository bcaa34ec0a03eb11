"""People's second factor in the console: a password alone changes nothing, a code at login or on the
second-factor page does; enrolment gives recovery codes; an approval above the tenant's step-up amount
asks for a fresh code; failed logins lock the user out from that address, audited.

Every refusal here is a crafted request (the POST a hidden button would have sent), answered 403 or sent
to the second-factor page, audited, with the rows as they were. Every operator action's crafted POST
from a password-only session is in tests/admin/test_operator_permissions.py.
"""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django_otp.oath import TOTP
from django_otp.plugins.otp_totp.models import TOTPDevice

from tests.support.issued_ids import call_labelled
from tests.support.operators import PASSWORD, current_code, make_operator, verified, verify_session
from tools_app import approvals
from tools_app.access.roles import APPROVER, OPERATOR
from tools_app.approvals.models import ApprovalRequest, ApprovalSettings, ApprovalStatus
from tools_app.conf import override_conf
from tools_app.core.errors import Refused
from tools_app.models import AuditEvent, TenantLimits
from tools_app.retention.models import RetentionOverride

NOTE = {"title": "Maintenance", "body": "Down at 2am", "audience": "staff", "idempotency_key": "a-1"}


def pending_announcement(caller) -> ApprovalRequest:
    result = call_labelled(caller, "publish_announcement", NOTE)
    return ApprovalRequest.objects.get(pk=result.error.as_dict()["approval"]["request_id"])


def pending_payment(caller, tenant, amount: str, key: str) -> ApprovalRequest:
    ApprovalSettings.objects.get_or_create(tenant=tenant, defaults={
        "payment_threshold": Decimal("100"), "step_up_amount": Decimal("1000"), "threshold_currency": "EUR"})
    result = call_labelled(caller, "request_payment", {"amount": amount, "currency": "EUR", "payee": "ACME",
                                                       "idempotency_key": key})
    return ApprovalRequest.objects.get(pk=result.error.as_dict()["approval"]["request_id"])


def act_url(request: ApprovalRequest, action: str = "approve") -> str:
    return reverse("admin:tools_app_approvalqueue_act", args=[request.pk, action])


def status_of(request: ApprovalRequest) -> str:
    return ApprovalRequest.objects.get(pk=request.pk).status


# --- a password alone changes nothing ------------------------------------------------------------------


def test_a_password_only_session_posting_approve_is_refused_audited_and_changes_nothing(client, caller, tenant):
    request = pending_announcement(caller)
    client.force_login(make_operator("bob", APPROVER, tenant), second_factor=False)
    events = AuditEvent.objects.count()

    response = client.post(act_url(request), {"reason": "crafted"})

    assert response.status_code == 403
    refusal = AuditEvent.objects.get(action="approval.refused", object_id=str(request.pk))
    assert refusal.actor == "user:bob" and "second factor required" in refusal.reason
    assert AuditEvent.objects.count() == events + 1
    assert status_of(request) == ApprovalStatus.PENDING and request.approvals == 0


def test_opening_an_action_unverified_leads_to_the_second_factor_page_and_a_code_leads_back(client, caller, tenant):
    request = pending_announcement(caller)
    bob = make_operator("bob", APPROVER, tenant)
    client.force_login(bob, second_factor=False)

    opened = client.get(act_url(request))
    assert opened.status_code == 302 and opened["Location"].startswith(reverse("admin:second_factor"))
    page = client.get(opened["Location"])
    assert page.status_code == 200 and "totp-secret" not in page.content.decode()  # enrolled: asks a code only

    entered = client.post(opened["Location"], {"code": current_code(bob), "next": act_url(request)})
    assert entered.status_code == 302 and entered["Location"] == act_url(request)
    done = client.post(act_url(request), {"reason": "checked"}, follow=True)
    assert status_of(request) == ApprovalStatus.APPROVED, [str(m) for m in done.context["messages"]]


def test_a_wrong_code_on_the_second_factor_page_is_refused_and_audited(client, caller, tenant):
    bob = make_operator("bob", APPROVER, tenant)
    client.force_login(bob, second_factor=False)
    right = current_code(bob)

    response = client.post(reverse("admin:second_factor"), {"code": f"{(int(right) + 1) % 1_000_000:06d}"})

    assert response.status_code == 200 and "not valid" in response.content.decode()
    assert AuditEvent.objects.filter(action="second_factor.code_refused", after__user="bob").count() == 1
    assert not client.get(reverse("admin:second_factor")).context["verified_at"]


def test_the_concept_function_refuses_a_user_from_no_verified_session(caller, tenant):
    request = pending_announcement(caller)
    bob = make_operator("bob", APPROVER, tenant)
    bob.otp_device = None  # as django-otp's middleware leaves a password-only session's user

    with pytest.raises(Refused, match="second factor required"):
        approvals.approve(request, bob)

    assert status_of(request) == ApprovalStatus.PENDING
    assert AuditEvent.objects.filter(action="approval.refused", actor="user:bob").count() == 1


def test_changing_limits_or_retention_without_a_second_factor_is_refused_and_saves_nothing(client, tenant):
    client.force_login(make_operator("olga", OPERATOR, tenant), second_factor=False)

    limits = client.post(reverse("admin:tools_app_tenantlimits_add"), {
        "tenant": tenant.pk, "calls_per_minute": "1", "calls_per_minute_per_token": "",
        "concurrent_tasks_per_agent": ""})
    retention = client.post(reverse("admin:tools_app_retentionoverride_add"), {
        "tenant": tenant.pk, "tool": "", "records": "1 00:00:00", "tasks": "", "artifacts": "", "documents": ""})

    assert (limits.status_code, retention.status_code) == (403, 403)
    assert not TenantLimits.objects.exists() and not RetentionOverride.objects.exists()
    refused = AuditEvent.objects.filter(actor="user:olga", reason__contains="second factor required")
    assert sorted(refused.values_list("action", flat=True)) == ["limits.change_refused", "retention.change_refused"]


# --- logging in with the code -----------------------------------------------------------------------------


def log_in(client, username: str, code: str = "", password: str = PASSWORD):
    return client.post(f"{reverse('admin:login')}?next=/admin/", {
        "username": username, "password": password, "otp_token": code, "next": "/admin/"})


def test_a_login_with_the_code_may_approve_and_one_without_may_only_look(caller, tenant):
    request = pending_announcement(caller)
    bob = make_operator("bob", APPROVER, tenant)
    looking, deciding = Client(), Client()

    assert log_in(looking, "bob").status_code == 302
    assert log_in(deciding, "bob", current_code(bob)).status_code == 302

    assert looking.get(reverse("admin:tools_app_approvalqueue_changelist")).status_code == 200
    assert looking.post(act_url(request), {"reason": "crafted"}).status_code == 403
    assert status_of(request) == ApprovalStatus.PENDING
    assert deciding.post(act_url(request), {"reason": "checked"}).status_code == 302
    assert status_of(request) == ApprovalStatus.APPROVED


def test_a_wrong_code_refuses_the_login(tenant):
    bob = make_operator("bob", APPROVER, tenant)
    client = Client()

    response = log_in(client, "bob", f"{(int(current_code(bob)) + 1) % 1_000_000:06d}")

    assert response.status_code == 200 and "not valid" in response.content.decode()
    assert "_auth_user_id" not in client.session


def test_failed_logins_lock_the_user_out_from_that_address_and_are_audited(settings, tenant):
    override_conf(settings, login_failure_limit=3)
    settings.AXES_FAILURE_LIMIT = 3  # settings.py reads it from the settings object at start-up
    make_operator("bob", APPROVER, tenant)
    client = Client(REMOTE_ADDR="203.0.113.9")

    for _ in range(3):
        assert log_in(client, "bob", password="guess").status_code in (200, 429)
    locked = log_in(client, "bob")  # the right password, too late

    assert locked.status_code == 429 and "_auth_user_id" not in client.session
    assert AuditEvent.objects.filter(action="login.failed", after__username="bob").count() >= 3
    lockouts = AuditEvent.objects.filter(action="login.locked_out")  # at the limit, and each attempt after it
    assert lockouts.count() == 2
    assert {(e.actor, e.after["username"], e.after["address"]) for e in lockouts} == {
        ("anonymous", "bob", "203.0.113.9")}
    # another address is not locked out: the lockout is per user and address
    assert log_in(Client(REMOTE_ADDR="198.51.100.7"), "bob").status_code == 302


# --- enrolment and recovery codes --------------------------------------------------------------------------


def test_a_person_without_an_authenticator_enrols_and_gets_recovery_codes_that_work_once(client, tenant):
    user = User.objects.create_user("nina", password=PASSWORD, is_staff=True)
    client.force_login(user, second_factor=False)

    page = client.get(reverse("admin:second_factor"))
    secret = page.context["secret"]
    assert page.context["enrolling"] and page.context["otpauth_uri"].startswith("otpauth://totp/idemops%3Anina?")
    device = TOTPDevice.objects.get(user=user)
    assert not device.confirmed
    code = f"{TOTP(device.bin_key).token():06d}"
    enrolled = client.post(reverse("admin:second_factor"), {"code": code})

    codes = enrolled.context["recovery_codes"]
    assert len(codes) == 10 and TOTPDevice.objects.get(user=user).confirmed
    assert secret and AuditEvent.objects.filter(action="second_factor.enrolled", after__user="nina").exists()
    assert client.get(reverse("admin:second_factor")).context["verified_at"] is not None

    again = Client()
    again.force_login(user)  # a plain client: a session without a code
    assert again.post(reverse("admin:second_factor"), {"code": codes[0]}).status_code == 302
    reused = Client()
    reused.force_login(user)
    assert "not valid" in reused.post(reverse("admin:second_factor"), {"code": codes[0]}).content.decode()


# --- step-up ----------------------------------------------------------------------------------------------


def test_an_approval_above_the_step_up_amount_with_a_stale_code_asks_again_then_approves(settings, client, caller,
                                                                                       tenant):
    override_conf(settings, step_up_minutes=10)
    request = pending_payment(caller, tenant, "5000.00", "p-big")
    bob = make_operator("bob", APPROVER, tenant)
    client.force_login(bob, second_factor=False)
    verify_session(client, bob, at=timezone.now() - timedelta(minutes=11))

    asked = client.post(act_url(request), {"reason": "checked the invoice"})

    assert asked.status_code == 302 and "stale=1" in asked["Location"]
    assert status_of(request) == ApprovalStatus.PENDING
    refusal = AuditEvent.objects.get(action="approval.refused", object_id=str(request.pk))
    assert refusal.reason.startswith("step-up:") and refusal.actor == "user:bob"

    assert client.post(asked["Location"], {"code": current_code(bob), "next": act_url(request)}).status_code == 302
    assert client.post(act_url(request), {"reason": "checked the invoice"}).status_code == 302
    assert status_of(request) == ApprovalStatus.APPROVED


def test_below_the_step_up_amount_the_sessions_older_code_suffices(settings, client, caller, tenant):
    override_conf(settings, step_up_minutes=10)
    request = pending_payment(caller, tenant, "500.00", "p-small")
    bob = make_operator("bob", APPROVER, tenant)
    client.force_login(bob, second_factor=False)
    verify_session(client, bob, at=timezone.now() - timedelta(hours=3))

    assert client.post(act_url(request), {"reason": "fine"}).status_code == 302

    assert status_of(request) == ApprovalStatus.APPROVED


def test_step_up_is_checked_by_the_concept_whoever_calls_it(settings, caller, tenant):
    override_conf(settings, step_up_minutes=10)
    request = pending_payment(caller, tenant, "5000.00", "p-direct")
    bob = verified(make_operator("bob", APPROVER, tenant), at=timezone.now() - timedelta(minutes=30))

    with pytest.raises(Refused, match="step-up"):
        approvals.approve(request, bob)
    approvals.approve(request, verified(bob))

    assert status_of(request) == ApprovalStatus.APPROVED


def test_the_link_in_an_approvers_message_opens_only_after_the_second_factor(client, caller, tenant):
    request = pending_announcement(caller)
    bob = make_operator("bob", APPROVER, tenant)
    link = reverse("admin:approval_link", args=[request.pk])
    client.force_login(bob, second_factor=False)

    asked = client.get(link)
    assert asked.status_code == 302 and asked["Location"].startswith(reverse("admin:second_factor"))

    back = client.post(asked["Location"], {"code": current_code(bob), "next": link})
    assert back.status_code == 302 and back["Location"] == link
    opened = client.get(link)
    assert opened.status_code == 302
    assert opened["Location"] == reverse("admin:tools_app_approvalqueue_change", args=[request.pk])
