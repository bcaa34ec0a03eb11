"""The idempotency extension's conformance suite and the official MCP one, against the platform."""
