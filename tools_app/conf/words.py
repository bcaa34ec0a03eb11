"""The settings in words: what each field accepts (`a number of seconds > 0`), for the start-up
messages and for docs/settings.md, which `markdown()` writes (`make settings-doc`).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import annotated_types
from pydantic import AfterValidator, SecretStr

from tools_app.conf.fields import (
    PREFIX,
    RENAMED,
    EnvironmentSettings,
    IdemopsSettings,
    check_http_url,
    check_network,
    check_postgres_url,
    env_name,
)

UNITS = {"_seconds": "seconds", "_minutes": "minutes", "_bytes": "bytes", "_ms": "milliseconds",
         "_chars": "characters", "_days": "days"}


def _unit(name: str) -> str:
    return next((unit for suffix, unit in UNITS.items() if name.endswith(suffix)), "")


def _bounds(metadata: Sequence[Any]) -> str:
    words = []
    for item in metadata:
        for kind, symbol in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            if isinstance(item, getattr(annotated_types, kind.capitalize())):
                words.append(f"{symbol} {getattr(item, kind):g}")
    return " and ".join(words)


def _is_url(metadata: Sequence[Any]) -> bool:
    return any(isinstance(item, AfterValidator) and item.func is check_http_url for item in metadata)


def _kind(annotation: Any, metadata: Sequence[Any] = ()) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if _is_url(metadata):
        return "an http(s) URL"
    if any(isinstance(item, AfterValidator) and item.func is check_postgres_url for item in metadata):
        return "a PostgreSQL URL"
    if any(isinstance(item, AfterValidator) and item.func is check_network for item in metadata):
        return "an IP network"
    if origin is Annotated:
        return _kind(args[0], list(args[1:]))
    if origin in (typing.Union, types.UnionType):
        return _kind(next(arg for arg in args if arg is not types.NoneType), metadata)
    if origin is Literal:
        return "one of " + ", ".join(args)
    if origin is list:
        inner = _kind(args[0])
        plural = {"text": "", "text (secret)": " of secrets", "an http(s) URL": " of http(s) URLs",
                  "an IP network": " of IP networks (CIDR)"}
        return "a comma-separated list" + plural.get(inner, f" (each {inner})")
    return {bool: "true or false", int: "an integer", float: "a number", Path: "a path",
            SecretStr: "text (secret)"}.get(annotation, "text")


def expected(name: str, model: type[EnvironmentSettings] = IdemopsSettings) -> str:
    """What a field accepts, in words: `a number of seconds > 0`."""
    field = model.model_fields[name]
    if name in ("port", "email_port"):
        return "a port number, 1 to 65535"
    kind, unit, bounds = _kind(field.annotation, field.metadata), _unit(name), _bounds(field.metadata)
    if unit:
        kind = f"{'a whole number' if kind == 'an integer' else kind} of {unit}"
    return f"{kind} {bounds}".strip()


def _extra(name: str, model: type[EnvironmentSettings] = IdemopsSettings) -> dict[str, Any]:
    """What `setting()` said of a field beyond pydantic's own (its section, how its default is shown)."""
    extra = model.model_fields[name].json_schema_extra
    return extra if isinstance(extra, dict) else {}


def _shown_default(name: str, model: type[EnvironmentSettings] = IdemopsSettings) -> str:
    field = model.model_fields[name]
    if shown := _extra(name, model).get("shown"):
        return str(shown)
    default = field.default
    if default is None:
        return "unset"
    if default == "":
        return "empty"
    if isinstance(default, bool):
        return "true" if default else "false"
    if isinstance(default, list):
        return "`" + ",".join(default) + "`" if default else "empty"
    if isinstance(default, int) and default >= 1024 * 1024 and default % (1024 * 1024) == 0:
        return f"{default // (1024 * 1024)} MiB"
    if isinstance(default, int | float):
        return f"{default:g}"
    return f"`{default}`"


def _table(model: type[EnvironmentSettings], names: list[str]) -> list[str]:
    lines = ["| Variable | Default | Type | What it does |", "| --- | --- | --- | --- |"]
    for name in names:
        lines.append(f"| `{env_name(name, model)}` | {_shown_default(name, model)} | {expected(name, model)} | "
                     f"{model.model_fields[name].description} |")
    return lines


def markdown(apps: Sequence[type[EnvironmentSettings]] = ()) -> str:
    """docs/settings.md: the platform's settings, then each of `apps`' (idemops.conf.AppSettings) under
    its title."""
    lines = [
        "# Settings",
        "",
        "<!-- Generated from tools_app/conf/fields.py by `make settings-doc`; "
        "tests/deploy/test_settings.py fails when it is out of date. -->",
        "",
        "Every setting is an environment variable, read once at start-up into one typed, frozen object",
        "(`tools_app/conf/fields.py`); the code reads `conf().<name>`. Every idemops variable starts with",
        f"`{PREFIX}`; the one exception is `DATABASE_URL`, the universal convention (the standard",
        "`OTEL_*` variables of OpenTelemetry are the others: they choose where traces go, see",
        "docs/observability.md).",
        "",
        "A bad value stops `manage.py`, uvicorn and the job cluster at start-up with one line per",
        "problem, naming the variable, what is wrong and what it expects. So does an unknown",
        f"`{PREFIX}` variable (a typo) and a variable of the old names below: a renamed setting",
        "silently ignored would run production on a default.",
        "",
        "Lists are comma-separated. Booleans are `true`/`false` (also `1`/`0`, `yes`/`no`, `on`/`off`).",
    ]
    sections: dict[str, list[str]] = {}
    for name in IdemopsSettings.model_fields:
        sections.setdefault(str(_extra(name)["section"]), []).append(name)
    for section, names in sections.items():
        lines += ["", f"## {section}", "", *_table(IdemopsSettings, names)]
    for model in apps:
        lines += ["", f"## {getattr(model, 'title', '') or model.__name__}", "",
                  "An app's own settings (its `idemops_settings` module, registered with "
                  "`idemops.conf.register_settings`): read only where the app is installed.", "",
                  *_table(model, list(model.model_fields))]
        if renamed := getattr(model, "renamed", {}):
            lines += ["", "Its old names (setting one stops start-up, naming its replacement):", "",
                      "| Old variable | New variable |", "| --- | --- |",
                      *(f"| `{old}` | `{new}` |" for old, new in renamed.items())]
    lines += ["", "## Old names", "",
              "These variables were renamed; setting one stops start-up, naming its replacement.", "",
              "| Old variable | New variable |", "| --- | --- |"]
    lines += [f"| `{old}` | `{new}` |" for old, new in RENAMED.items()]
    return "\n".join(lines) + "\n"
