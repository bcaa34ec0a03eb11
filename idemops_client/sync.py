"""A synchronous IdempotentClient for scripts and frameworks that are not async.

    with SyncClient(url, token, ledger=Ledger("calls.sqlite"), session_id="job-7") as client:
        result = client.call("create_order", {...})

SyncClient lives in client.py beside the async client (its `sync()` makes one); this module keeps
its import path. The async client runs on an event loop in a thread of its own (anyio's blocking portal);
each method blocks until that loop answers. Same keys, ledger, retries and traces.
"""

from idemops_client.client import SyncClient

__all__ = ["SyncClient"]
