"""The bearer-token cache of a web process: a call verifies a token read moments ago without a
query; a revocation is honoured at once where it happened and within the cache period elsewhere."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.support.operators import agent_owner
from tools_app import access
from tools_app.access import tokens
from tools_app.conf import override_conf


@pytest.fixture
def raw_token(db):
    tokens._verified.clear()
    _, raw = access.issue_token(access.create_tenant("cache"), "agent", owner=agent_owner())
    yield raw
    tokens._verified.clear()


def queries_of(fn):
    with CaptureQueriesContext(connection) as captured:
        result = fn()
    return result, len(captured.captured_queries)


def test_a_token_verified_moments_ago_is_verified_again_without_a_query(raw_token):
    first, first_queries = queries_of(lambda: access.authenticate_token(raw_token))
    again, again_queries = queries_of(lambda: access.authenticate_token(raw_token))

    assert first_queries >= 1 and again_queries == 0
    assert again.pk == first.pk and again.tenant.slug == "cache"
    assert access.cached_token(raw_token).pk == first.pk


def test_a_token_revoked_in_this_process_is_refused_at_once(raw_token):
    token = access.authenticate_token(raw_token)

    access.revoke_token(token, actor="user:test")

    assert access.cached_token(raw_token) is None
    assert access.authenticate_token(raw_token) is None


def test_a_cached_token_is_read_again_once_the_cache_period_is_over(raw_token, settings):
    override_conf(settings, token_cache_seconds=60)
    token = access.authenticate_token(raw_token)
    # Revoked behind this process's back (another process, say): still trusted for the period…
    type(token).objects.update(revoked_at="2026-01-01T00:00Z")
    assert access.authenticate_token(raw_token) is not None

    # …which runs out (the cache's clock is this process's monotonic one: the entry is made older,
    # where a sleep as long as the period would race a slow machine on the side of "still trusted")…
    cached, read_at = tokens._verified[token.digest]
    tokens._verified[token.digest] = (cached, read_at - 60)

    # …then read again, and refused.
    assert access.cached_token(raw_token) is None
    assert access.authenticate_token(raw_token) is None


def test_a_cache_period_of_zero_reads_the_token_on_every_call(raw_token, settings):
    override_conf(settings, token_cache_seconds=0)
    access.authenticate_token(raw_token)

    _, queries = queries_of(lambda: access.authenticate_token(raw_token))

    assert queries >= 1


def test_an_unknown_token_is_not_cached(db):
    tokens._verified.clear()

    assert access.authenticate_token("idm_" + "x" * 43) is None
    assert tokens._verified == {}
