"""The approval queue in a real browser: Playwright driving headless Chromium against uvicorn
(tests/support/browser.py)."""


from idemops_demo.models import Announcement
from tests.support.browser import ARTIFACTS, browser_page, code_for, needs_chromium, shot
from tests.support.issued_ids import call_labelled_sync
from tests.support.jobs import run_queued_jobs
from tests.support.mcp_client import error_of
from tests.support.operators import PASSWORD, login_for_the_web_server, make_operator
from tools_app.access.roles import APPROVER
from tools_app.models import ApprovalRequest, ApprovalStatus, Tenant

pytestmark = needs_chromium


def ask(web_server, token, key, title):
    args = {"title": title, "body": "Down at 2am", "audience": "staff", "idempotency_key": key}
    return error_of(call_labelled_sync(web_server.mcp_url, token, "publish_announcement", args))["approval"], args


def test_an_approver_logs_in_approves_a_request_and_sees_it_leave_the_queue(web_server, token):
    # given: two pending requests from the agent, and an approver (ORM and MCP work stays outside the browser)
    login_for_the_web_server(make_operator("bob", APPROVER, Tenant.objects.get(slug="acme")))
    to_approve, args = ask(web_server, token, "ann-1", "Maintenance window")
    to_keep, _ = ask(web_server, token, "ann-2", "Lunch menu")

    with browser_page() as page:
        # when: bob logs in, opens the request from the queue and approves it
        page.goto(f"{web_server.base_url}/admin/login/?next=/admin/tools_app/approvalqueue/")
        page.fill("#id_username", "bob")
        page.fill("#id_password", PASSWORD)
        page.fill("#id_otp_token", code_for("bob"))  # the code from bob's authenticator
        page.click("input[type=submit]")
        page.wait_for_selector("#result_list")
        rows = page.locator("#result_list tbody tr")
        assert rows.count() == 2
        shot(page, "01-queue-before")

        page.get_by_role("link", name=to_approve["summary"]).click()
        page.wait_for_selector("#action-approve")
        shot(page, "02-request")
        page.click("#action-approve")
        page.fill("#id_reason", "checked with the team")
        shot(page, "03-confirm")
        page.click("#confirm-action")
        page.wait_for_selector("ul.messagelist")

        # then: it left the queue, the other one is still there
        assert "approved; it is being executed" in page.locator("ul.messagelist").inner_text()
        assert rows.count() == 1
        assert to_keep["summary"] in rows.first.inner_text()
        assert page.get_by_role("link", name=to_approve["summary"]).count() == 0
        shot(page, "04-queue-after")

        page.goto(f"{web_server.base_url}/admin/tools_app/dashboard/")
        assert page.locator("#approvals-waiting").inner_text() == "1"
        shot(page, "05-dashboard")

    assert ApprovalRequest.objects.get(pk=to_approve["request_id"]).status == ApprovalStatus.APPROVED
    run_queued_jobs()
    result = call_labelled_sync(web_server.mcp_url, token, "publish_announcement", args)
    assert result.structured_content["announcement_id"] == Announcement.objects.get().pk
    assert (ARTIFACTS / "04-queue-after.png").stat().st_size > 0
