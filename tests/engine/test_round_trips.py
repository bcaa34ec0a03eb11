"""How many times a call waits for PostgreSQL: counted in libpq's own trace of the connection.

Each Sync (a statement of the extended protocol) or Query (BEGIN, COMMIT) the client sends is one
round trip. A first call claims at once (the claim statement also reads a live record), so a local
tool's first call is BEGIN, the claim, its effect, the SUCCEEDED mark and COMMIT, with no read
before; a replay is one statement once replays are what its tool mostly sees.
"""

import uuid

import pytest

from idemops_demo.models import Order
from tests.support.round_trips import round_trips
from tools_app import access, engine
from tools_app.core.errors import Transient
from tools_app.engine import Operation
from tools_app.models import IdempotencyRecord

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_local_tools_first_call_is_begin_claim_effect_mark_commit_and_its_replay_one_statement():
    tenant = access.create_tenant(f"trips-{uuid.uuid4().hex[:6]}")
    tool = f"create_order_{uuid.uuid4().hex[:6]}"  # a tool of its own: its own share of replays

    def operation(key: str) -> Operation:
        return Operation(tenant_id=tenant.pk, tool=tool, key=key, arguments={"customer": "ACME"},
                         actor="agent:acme/test")

    def make_order(record):
        return {"order_id": Order.objects.create(tenant=tenant, record=record, customer="ACME", currency="EUR",
                                                 total=1).pk}

    engine.run(operation("warm-up"), make_order)  # statements prepared, settings read
    first = round_trips(lambda: engine.run(operation("k-1"), make_order))
    assert first == ["Query BEGIN", "Sync", "Sync", "Sync", "Query COMMIT"]  # claim, the order, the mark

    # A replay among first calls: the claim's statement read it (BEGIN and COMMIT around it).
    assert round_trips(lambda: engine.run(operation("k-1"), make_order)) == ["Query BEGIN", "Sync", "Query COMMIT"]
    # Once replays are most of what the tool sees, a replay is one read.
    for _ in range(30):
        assert engine.run(operation("k-1"), make_order).replayed
    assert round_trips(lambda: engine.run(operation("k-1"), make_order)) == ["Sync"]
    # A first call among them reads, then claims: one read more.
    assert round_trips(lambda: engine.run(operation("k-2"), make_order)) == [
        "Sync", "Query BEGIN", "Sync", "Sync", "Sync", "Query COMMIT"]
    assert Order.objects.filter(tenant=tenant).count() == 3


def test_a_downstream_tools_replay_is_the_claim_statement_alone():
    tenant = access.create_tenant(f"trips-{uuid.uuid4().hex[:6]}")
    tool = f"pay_{uuid.uuid4().hex[:6]}"
    sent = []

    def operation(key: str) -> Operation:
        return Operation(tenant_id=tenant.pk, tool=tool, key=key, arguments={"amount": "1"},
                         actor="agent:acme/test", transactional=False)

    def pay(record):
        sent.append(record.downstream_key)
        return {"paid": True}

    engine.run(operation("warm-up"), pay)
    assert round_trips(lambda: engine.run(operation("k-1"), pay))[0] == "Sync"  # the claim, committed on its own
    assert round_trips(lambda: engine.run(operation("k-1"), pay)) == ["Sync"]
    assert len(sent) == 2


@pytest.mark.parametrize("transactional", [True, False])
def test_only_a_call_that_runs_is_admitted_and_a_local_call_held_back_leaves_nothing(transactional):
    """op.admit may take the one probe of a circuit breaker: a replay must never be admitted, whichever
    it does first (read or claim), and a local call held back after winning its claim rolls it back."""
    tenant = access.create_tenant(f"trips-{uuid.uuid4().hex[:6]}")
    tool = f"tool_{uuid.uuid4().hex[:6]}"
    admitted: list[str] = []
    holding = {"back": False}

    def admit_for(key: str):
        def admit() -> None:
            admitted.append(key)
            if holding["back"]:
                raise Transient("paused by an operator", retry_after=5)
        return admit

    def operation(key: str) -> Operation:
        return Operation(tenant_id=tenant.pk, tool=tool, key=key, arguments={"n": 1}, actor="agent:acme/test",
                         transactional=transactional, admit=admit_for(key))

    assert not engine.run(operation("k-1"), lambda record: {"ok": True}).replayed
    for _ in range(3):
        assert engine.run(operation("k-1"), lambda record: {"ok": True}).replayed
    assert admitted == ["k-1"]  # the first call only

    holding["back"] = True
    held = engine.run(operation("k-2"), lambda record: {"ok": True})
    assert held.error is not None and held.error.error_class == "transient"
    assert engine.run(operation("k-1"), lambda record: {"ok": True}).replayed  # replays go on
    assert admitted == ["k-1", "k-2"]
    assert not IdempotencyRecord.objects.filter(tenant=tenant, key="k-2").exists()


def test_the_engine_reads_djangos_connection_through_no_proxy_attribute(monkeypatch):
    """Every attribute read through Django's `connection` proxy looks this thread's connection up again
    (an asgiref Local): a first call's JSON values each read `connection.ops` that way. The engine looks
    the connection up once where it hands it on (core.db), so neither a first call nor a replay reads the
    proxy."""
    from django.utils.connection import ConnectionProxy

    tenant = access.create_tenant(f"proxy-{uuid.uuid4().hex[:6]}")

    def operation(key: str) -> Operation:
        return Operation(tenant_id=tenant.pk, tool="proxy_reads", key=key, actor="agent:acme/test",
                         arguments={"customer": "ACME", "items": [{"sku": "A", "quantity": 1}]})

    for _ in range(2):  # a first call and a replay: what is built once per process (statements, converters) is built
        engine.run(operation("warm-up"), lambda record: {"ok": True})
    read = []
    through = ConnectionProxy.__getattr__
    monkeypatch.setattr(ConnectionProxy, "__getattr__", lambda proxy, name: read.append(name) or through(proxy, name))

    first = engine.run(operation("k-1"), lambda record: {"ok": True, "items": [1, 2]})
    replay = engine.run(operation("k-1"), lambda record: {"ok": False})

    assert (first.executed, replay.replayed, replay.record.result) == (True, True, {"ok": True, "items": [1, 2]})
    assert read == []
