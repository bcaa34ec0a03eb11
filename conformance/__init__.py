"""A conformance suite for the MCP idempotency extension `io.idemops/idempotency`.

It checks any MCP server over Streamable HTTP against docs/extension/idempotency.md, with raw
JSON-RPC (httpx2) at either protocol revision; it imports nothing of the server it checks.

    python -m conformance --url http://127.0.0.1:8000/mcp --token $TOKEN --protocol 2026-07-28
"""
