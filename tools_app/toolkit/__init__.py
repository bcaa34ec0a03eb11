"""What a tool author imports: declaring tools, their policies and pipelines, and calling them.

`registry.py` declares a tool once (name, pydantic input and output models,
whether it writes, non-business fields, retention and expiry policy, handler,
reconciler, approval rule, pipeline); `policies.py` the answers a reconciler
gives and what a sensitive call needs; `pipelines.py` the steps of a long
tool; `downstream.py` how to call another system and classify its answers;
`calls.py` one tool call from any entry point (validate, then run it under
the engine for writes); `hooks.py` how approvals and tasks plug into a call.

May import: core, access, engine.
"""

from tools_app.toolkit.hooks import hooks

__all__ = ["hooks"]
