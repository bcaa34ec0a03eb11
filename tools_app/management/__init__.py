"""Management commands (thin: each calls a concept function) and the demo set-up `make run` uses.

May import: every package below the entry points.
"""
