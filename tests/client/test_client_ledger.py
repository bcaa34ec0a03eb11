"""The call ledger: persistence, one entry per operation under concurrency, expiry, and the model's summary."""

import json
import subprocess
import sys
import threading
import time

import pytest

from idemops_client import Entry, Ledger, MemoryLedger, State
from idemops_client.summary import render
from tests.support.processes import ROOT


@pytest.fixture(params=["sqlite", "memory"])
def store(request, tmp_path):
    ledger = Ledger(tmp_path / "calls.sqlite") if request.param == "sqlite" else MemoryLedger()
    yield ledger
    ledger.close()


def entry(store, call_id="c1", key=None, session="s", tool="create_order", **fields) -> Entry:
    return store.new_entry(session_id=session, tool=tool, call_id=call_id, key=key or call_id, fingerprint="f",
                           arguments={"customer": "ACME"}, **fields)


def test_a_live_entry_wins_over_a_second_add_of_the_same_call(store):
    first = store.add(entry(store, key="first"))
    second = store.add(entry(store, key="second"))

    assert (first.key, second.key) == ("first", "first")
    assert [e.key for e in store.entries("s")] == ["first"]


def test_saved_states_and_results_read_back(store):
    stored = store.add(entry(store))
    stored.state, stored.result, stored.operation_id = State.DONE, {"order_id": 17}, "op-1"
    store.save(stored)

    again = store.get("s", "create_order", "c1")
    assert (again.state, again.result, again.operation_id) == (State.DONE, {"order_id": 17}, "op-1")
    assert store.get("other-session", "create_order", "c1") is None


def test_expired_entries_are_ignored_replaced_and_purged(store):
    store.ttl = 0.05
    store.add(entry(store, key="old"))
    time.sleep(0.1)

    assert store.get("s", "create_order", "c1") is None
    assert store.entries("s") == []
    store.ttl = 60
    assert store.add(entry(store, key="new")).key == "new"
    store.ttl = 0.05
    store.add(entry(store, call_id="c2"))
    time.sleep(0.1)
    assert store.purge_expired() == 1
    assert [e.key for e in store.entries("s")] == ["new"]


def test_threads_adding_the_same_calls_agree_on_one_entry_each(store):
    winners = {}

    def add_all(name):
        winners[name] = [store.add(entry(store, call_id=f"c{i}", key=f"{name}-{i}")).key for i in range(100)]

    threads = [threading.Thread(target=add_all, args=(f"t{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len({tuple(keys) for keys in winners.values()}) == 1
    assert len(store.entries("s")) == 100


ADD_IN_A_PROCESS = """
import json, sys
from idemops_client import Ledger
ledger = Ledger(sys.argv[1])
name = sys.argv[2]
keys = [ledger.add(ledger.new_entry(session_id="s", tool="t", call_id=f"c{i}", key=f"{name}-{i}", fingerprint="f",
                                    arguments={})).key for i in range(200)]
print(json.dumps(keys))
"""


def test_two_processes_on_one_file_agree_on_one_entry_per_call(tmp_path):
    path = tmp_path / "shared.sqlite"
    Ledger(path).close()  # the schema exists before both start
    processes = [subprocess.Popen([sys.executable, "-c", ADD_IN_A_PROCESS, str(path), name], cwd=ROOT,
                                  stdout=subprocess.PIPE, text=True) for name in ("p1", "p2")]
    outputs = [json.loads(p.communicate(timeout=60)[0]) for p in processes]

    assert [p.returncode for p in processes] == [0, 0]
    assert outputs[0] == outputs[1]
    assert len(Ledger(path).entries("s")) == 200


def test_the_sqlite_ledger_keeps_entries_after_it_is_closed_and_reopened(tmp_path):
    ledger = Ledger(tmp_path / "calls.sqlite")
    stored = ledger.add(entry(ledger))
    stored.state = State.UNKNOWN
    ledger.save(stored)
    ledger.close()

    reopened = Ledger(tmp_path / "calls.sqlite")
    assert reopened.get("s", "create_order", "c1").state == State.UNKNOWN


def test_the_summary_has_one_line_per_operation_with_its_state_and_an_abbreviated_key():
    store = MemoryLedger()
    done = store.add(store.new_entry(
        session_id="s", tool="create_order", call_id="ik-0123456789abcdef", key="ik-0123456789abcdef",
        fingerprint="f", arguments={"customer": "ACME", "items": [{}, {}, {}], "currency": "EUR"}))
    done.state, done.result = State.DONE, {"order_id": 17, "total": "7.50", "idempotency": {"operation_id": "x"}}
    store.save(done)
    unknown = store.add(store.new_entry(session_id="s", tool="request_payment", call_id="p", key="op-abcdef0123456789",
                                        fingerprint="f", arguments={"amount": "12.34", "api_key": "sk-secret"}))
    unknown.state = State.UNKNOWN
    store.save(unknown)
    failed = store.add(store.new_entry(session_id="s", tool="create_order", call_id="x", key="x", fingerprint="f",
                                       arguments={"customer": "B"}))
    failed.state, failed.error = State.FAILED, {"class": "invalid_input", "message": "currency: pattern"}
    store.save(failed)

    lines = store.summary_for_model("s").splitlines()

    assert lines[1:] == [
        "- create_order(customer=ACME, 3 items, currency=EUR) → done, order 17 (key ik-01234567…)",
        "- request_payment(amount=12.34, api_key=***) → unknown (may have happened; being checked) "
        "(key op-abcdef01…)",
        "- create_order(customer=B) → failed: invalid_input (currency: pattern) (key x)",
    ]
    assert "sk-secret" not in store.summary_for_model("s")
    assert render([]) == "No tool calls with side effects in this session yet."
