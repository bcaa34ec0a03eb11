"""The big lists' time filters (tools_app/admin/date_range.py): from and to days, both included, on created
and finished times; a bad day, typed or crafted, is refused with a message and the list still shows."""

from datetime import datetime, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.support.api_support import make_event, make_record
from tests.support.operators import make_operator
from tools_app.access.roles import AUDITOR, OPERATOR

RECORDS = reverse("admin:tools_app_idempotencyrecord_changelist")

BIG_LISTS = {
    "idempotencyrecord": ["created_at", "finished_at"],
    "auditevent": ["created_at"],
    "task": ["created_at", "finished_at"],
    "approvalrequest": ["created_at", "finished_at"],
    "outboxevent": ["created_at", "delivered_at"],
}


def at(day: int, hour: int = 12) -> datetime:
    return timezone.make_aware(datetime(2026, 3, day, hour))


@pytest.fixture
def olga(client, tenant):
    client.force_login(make_operator("olga", OPERATOR, tenant))


@pytest.fixture
def march(tenant):
    """One record created on each of the 1st to the 5th of March, at noon, each finished a day later."""
    return {day: make_record(tenant, created_at=at(day), finished_at=at(day + 1), key=f"march-{day}")
            for day in range(1, 6)}


def listed(page, records) -> list[int]:
    return sorted(day for day, record in records.items()
                  if f"/admin/tools_app/idempotencyrecord/{record.pk}/change/" in page.text)


def test_from_and_to_days_list_the_records_created_on_those_days_both_included(client, olga, march):
    page = client.get(RECORDS, {"created_at__gte": "2026-03-02", "created_at__lte": "2026-03-04"})

    assert page.status_code == 200
    assert listed(page, march) == [2, 3, 4]


def test_a_from_day_alone_or_a_to_day_alone_is_open_on_the_other_side(client, olga, march):
    assert listed(client.get(RECORDS, {"created_at__gte": "2026-03-04"}), march) == [4, 5]
    assert listed(client.get(RECORDS, {"created_at__lte": "2026-03-01"}), march) == [1]


def test_the_finished_range_filters_on_the_finished_time(client, olga, march):
    page = client.get(RECORDS, {"finished_at__gte": "2026-03-05", "finished_at__lte": "2026-03-05"})

    assert listed(page, march) == [4]


def test_the_time_filter_keeps_the_lists_other_filters(client, olga, tenant, march):
    failed = make_record(tenant, status="failed", error_class="invalid_input", created_at=at(3))

    page = client.get(RECORDS, {"status__exact": "failed", "created_at__gte": "2026-03-03",
                                "created_at__lte": "2026-03-03"})

    assert listed(page, march) == [] and f"/{failed.pk}/change/" in page.text
    assert '<input type="hidden" name="status__exact" value="failed">' in page.text


@pytest.mark.parametrize("params", [
    {"created_at__gte": "notadate"},
    {"created_at__lte": "2026-02-30"},
    {"created_at__lt": "yesterday"},
    {"created_at__gte": "2026-03-04", "created_at__lte": "2026-03-02"},
    {"finished_at__gte": "2026-03-01T00:00:00\x00"},
])
def test_a_bad_day_is_refused_with_a_message_and_the_list_still_shows(client, olga, march, params):
    page = client.get(RECORDS, params)

    assert page.status_code == 200
    assert "not applied" in page.text
    assert listed(page, march) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(("model", "field"), [(m, f) for m, fields in BIG_LISTS.items() for f in fields])
def test_every_big_list_offers_from_and_to_days_on_its_times_and_refuses_a_crafted_one(
        client, tenant, model, field):
    client.force_login(make_operator("ada", AUDITOR, tenant))
    make_event(tenant, created_at=at(2))
    url = reverse(f"admin:tools_app_{model}_changelist")

    page = client.get(url)
    crafted = client.get(url, {f"{field}__gte": "notadate"})

    assert page.status_code == 200
    assert f'<input type="date" name="{field}__gte"' in page.text
    assert f'<input type="date" name="{field}__lte"' in page.text
    assert crafted.status_code == 200 and "not applied" in crafted.text


def test_days_are_the_consoles_days_in_its_time_zone(client, olga, tenant):
    late = make_record(tenant, created_at=at(2, hour=23) + timedelta(minutes=30))

    page = client.get(RECORDS, {"created_at__gte": "2026-03-03"})

    assert f"/{late.pk}/change/" not in page.text
