"""The MCP entry point: the official SDK's MCPServer serving the tool registry at /mcp.

`server.py` turns each registered tool into an SDK tool and builds the ASGI
app; `runtime.py` is what every handler shares (database threads, the caller
behind the bearer token, rendering results and errors); `tasks_extension.py`
serves MCP tasks (the 2026-07-28 extension and the 2025-11-25 task methods)
from the durable tasks, and `task_protocols.py` the parts the SDK has no hook
for (a middleware); `task_watch.py` hears task changes (PostgreSQL
LISTEN/NOTIFY) and wakes requests that wait on them; `guards.py` the ASGI
checks in front of the SDK (malformed request ids, a database outage).

May import: everything below the entry points. Handlers stay thin: they call
toolkit.calls and the concept packages.
"""
