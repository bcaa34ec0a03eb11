"""The demo's tools, one module per business concept, each declared with `idemops.tools`."""
