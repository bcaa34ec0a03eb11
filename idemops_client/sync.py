"""A synchronous IdempotentClient for scripts and frameworks that are not async.

    with SyncClient(url, token, ledger=Ledger("calls.sqlite"), session_id="job-7") as client:
        result = client.call("create_order", {...})

The async client runs on an event loop in a thread of its own (anyio's blocking portal);
each method blocks until that loop answers. Same keys, ledger, retries and traces.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal

from idemops_client.client import CallResult, IdempotentClient, ToolInfo
from idemops_client.errors import ClientError
from idemops_client.ledger import Entry, SessionLedger
from idemops_client.retry import RetryPolicy


class SyncClient:
    """IdempotentClient's API without `await` (`IdempotentClient.sync(...)` makes one)."""

    def __init__(self, url: str, token: str | None = None, **options: Any):
        self.client = IdempotentClient(url, token, **options)
        self._portal: BlockingPortal | None = None
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = None

    def __enter__(self) -> SyncClient:
        self._portal_cm = start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        try:
            self._portal.call(self.client.__aenter__)
        except BaseException as exc:
            self._portal_cm.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def __exit__(self, *exc_info: Any) -> None:
        assert self._portal is not None and self._portal_cm is not None
        try:
            self._portal.call(self.client.__aexit__, None, None, None)
        finally:
            self._portal_cm.__exit__(*exc_info)
            self._portal = self._portal_cm = None

    def _run(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        if self._portal is None:
            raise ClientError("use SyncClient in `with`")
        return self._portal.call(functools.partial(function, *args, **kwargs))

    @property
    def ledger(self) -> SessionLedger:
        return self.client.ledger

    def call(self, tool: str, arguments: Mapping[str, Any] | None = None, *, key: str | None = None,
             policy: RetryPolicy | None = None) -> CallResult:
        result: CallResult = self._run(self.client.call, tool, arguments, key=key, policy=policy)
        return result

    def tools(self, refresh: bool = False) -> dict[str, ToolInfo]:
        tools: dict[str, ToolInfo] = self._run(self.client.tools, refresh)
        return tools

    def refresh(self) -> list[Entry]:
        entries: list[Entry] = self._run(self.client.refresh)
        return entries
