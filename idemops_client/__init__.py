"""A client for idemops' MCP tools that retries safely and remembers what it submitted.

    from idemops_client import IdempotentClient, Ledger

    async with IdempotentClient(url, token, ledger=Ledger("calls.sqlite"), session_id="chat-42") as client:
        result = await client.call("create_order", {...})
        print(client.ledger.summary_for_model())
"""

from idemops_client.canonical import canonical_json, derive_key, fingerprint
from idemops_client.client import CallResult, IdempotentClient, ToolInfo
from idemops_client.errors import ClientError, RetriesExhausted, ToolCallError, is_retryable
from idemops_client.ledger import Entry, Ledger, LedgerError, LedgerStore, MemoryLedger, SessionLedger, State
from idemops_client.retry import RetryPolicy
from idemops_client.sync import SyncClient

__all__ = [
    "CallResult", "ClientError", "Entry", "IdempotentClient", "Ledger", "LedgerError", "LedgerStore", "MemoryLedger",
    "RetriesExhausted", "RetryPolicy", "SessionLedger", "State", "SyncClient", "ToolCallError", "ToolInfo",
    "canonical_json",
    "derive_key", "fingerprint", "is_retryable",
]
