"""What an operator's pause may name (the console's page and `idemops pause` ask here): a tool of
the registry, or a downstream system a tool declared or the circuit breaker already knows by its
host. A pause of a name nothing calls would hold nothing back while looking as if it did. A
tenant's pause names its slug, which incidents.pause checks.
"""

from __future__ import annotations

from tools_app.core.errors import InvalidInput
from tools_app.incidents.models import Downstream, PauseScope
from tools_app.toolkit.registry import all_tools


def names(scope: str) -> list[str]:
    """The names a pause of `scope` may take, sorted (none for a tenant's)."""
    if scope == PauseScope.TOOL:
        return sorted(spec.name for spec in all_tools())
    if scope == PauseScope.DOWNSTREAM:
        declared = {spec.downstream for spec in all_tools() if spec.downstream}
        return sorted(declared | set(Downstream.objects.values_list("name", flat=True)))
    return []


def check(scope: str, target: str) -> str:
    """`target`, stripped, if a pause of `scope` may name it; else InvalidInput listing what may be named."""
    target = target.strip()
    if scope in (PauseScope.TOOL, PauseScope.DOWNSTREAM) and target not in (known := names(scope)):
        raise InvalidInput(f"no {scope} named {target!r}; known: {', '.join(known) or 'none'}")
    return target
