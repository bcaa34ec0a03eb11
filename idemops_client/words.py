"""What a tool's answer says to a model: the proxy's and the framework adapters' words.

A model follows words, not error classes: an operation that may have happened, or waits for a
person, must not be re-planned with other arguments or a new key, and an identical call answered
from the ledger was not run again.
"""

from __future__ import annotations

import json

from idemops_client.client import CallResult
from idemops_client.errors import RetriesExhausted, ToolCallError

LEDGER_URI = "idemops://ledger"

# What the model is told when an operation has no final answer yet: what to do, in words.
UNFINISHED = {
    "unknown_outcome": (
        "The outcome of this {tool} call is UNKNOWN: it may have happened. The server is checking it. Do not "
        "make it again with other arguments or another key, and do not assume it failed. Call {tool} again "
        "with exactly the same arguments later to learn the outcome (it will not run twice), or read "
        f"the ledger ({LEDGER_URI})."),
    "transport": (
        "No answer came back for this {tool} call (the connection to the server failed): it may have happened. "
        "Call {tool} again with exactly the same arguments to learn the outcome; it will not run twice."),
    "unavailable": (
        "The idemops server is unavailable right now. Call {tool} again with exactly the same arguments "
        "later; it will not run twice."),
    "in_progress": (
        "This {tool} call is still running on the server. Do not make it again with other arguments; call "
        "{tool} again with exactly the same arguments later to get its result (it will not run twice)."),
    "pending_approval": (
        "This {tool} call WAITS FOR A PERSON to approve it; it has not been done yet. Tell the user that it "
        "awaits approval. Do not make it again with other arguments or try to work around the approval; "
        "calling {tool} again with exactly the same arguments later reports whether it was approved and done."),
    "unauthorized": (
        "The idemops server refused the proxy's token (expired or revoked?). Nothing was done. Ask the user "
        "to issue a new token and restart the proxy with it."),
}




def from_ledger_note(result: CallResult) -> str:
    return (f"Answered from the ledger: this identical {result.tool} call was already done (key {result.key}); "
            "it was not run again. The recorded result follows.")


def result_text(result: CallResult) -> str:
    """A result as the text a framework hands its model."""
    body = json.dumps(result.structured, ensure_ascii=False, default=str)
    if result.from_ledger:
        return from_ledger_note(result) + "\n" + body
    return body


def error_text(error: ToolCallError) -> str:
    words = UNFINISHED.get(error.error_class)
    if words is not None:
        text = words.format(tool=error.tool)
        if isinstance(error, RetriesExhausted):
            text += f" (Asked {error.attempts} times with the same key; last answer: {error.message})"
        return text
    return (f"{error.tool} failed: {error.error_class}: {error.message}. This answer is final for these "
            "arguments: calling again with the same arguments gives the same error.")
