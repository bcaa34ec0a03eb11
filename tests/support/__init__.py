"""The suite's helpers: servers and processes started for a test (processes), agents and MCP clients,
races and faults, fixtures shared by several folders. Test folders are named after the package they test
(tests/engine for tools_app/engine, ...); what more than one folder uses lives here."""
