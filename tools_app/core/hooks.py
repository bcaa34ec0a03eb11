"""Hooks: how a lower package calls into a higher one without importing it.

A package declares the functions it needs from above as a dataclass of
callables with safe defaults (engine.hooks, toolkit.hooks); the packages
above register theirs once, when the app starts (tools_app.apps). The lower
package then calls `hooks.<name>(...)`. Layers stay one-way, and no import is
hidden inside a function to dodge a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass
class Hooks:
    def register(self, **functions: Any) -> None:
        """Set hooks by name; a name this set does not declare is a mistake, not a no-op."""
        known = {f.name for f in fields(self)}
        for name, function in functions.items():
            if name not in known:
                raise TypeError(f"{type(self).__name__} has no hook {name!r}; it has {sorted(known)}")
            setattr(self, name, function)
