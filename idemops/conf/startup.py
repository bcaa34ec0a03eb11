"""Start-up: read the environment once, or refuse with one line per problem.

An old variable name (fields.RENAMED), an unknown IDEMOPS_ variable and every value the
fields refuse are collected and reported together, naming the variable, what is wrong and
what it expects; secrets and the database URL (its password) are never echoed.
"""

from __future__ import annotations

import difflib
import os
import typing

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from idemops.conf.fields import PREFIX, RENAMED, IdemopsSettings, env_name, environment_names
from idemops.conf.words import expected


class SettingsError(Exception):
    """Settings idemops cannot start with; one line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join([
            f"idemops cannot start: {len(problems)} problem{'s' if len(problems) > 1 else ''} with its settings "
            "(every setting is described in docs/settings.md)",
            *(f"  - {problem}" for problem in problems)]))


def load() -> IdemopsSettings:
    """The settings from the environment, or SettingsError listing every problem found."""
    problems = _old_names(os.environ) + _unknown_names(os.environ)
    try:
        loaded = IdemopsSettings()
    except ValidationError as error:
        problems += [line for detail in error.errors(include_url=False) for line in _describe(detail)]
        loaded = None
    if problems:
        raise SettingsError(problems)
    assert loaded is not None, "every validation error is described as a problem"
    return loaded


def _old_names(environ: typing.Mapping[str, str]) -> list[str]:
    return [f"{old} is no longer read: set {new} instead"
            for old, new in RENAMED.items() if old in environ]


def _unknown_names(environ: typing.Mapping[str, str]) -> list[str]:
    known = environment_names()
    problems = []
    for name in sorted(environ):
        if name.upper().startswith(PREFIX) and name.upper() not in known:
            close = difflib.get_close_matches(name.upper(), known, n=1, cutoff=0.8)
            hint = f" (did you mean {close[0]}?)" if close else ""
            problems.append(f"{name} is not an idemops setting{hint}")
    return problems


def _describe(detail: ErrorDetails) -> list[str]:
    if detail["type"] == "default_factory_not_called":
        return []  # a consequence of another field's error, reported on its own line
    if not detail["loc"]:
        return detail["msg"].split("\n")
    first = str(detail["loc"][0])  # a setting's name: a top-level location is never a list index
    name = environment_names().get(first, first)  # an alias (DATABASE_URL) or a name
    field = IdemopsSettings.model_fields.get(name)
    if field is None:
        return [f"{name}: {detail['msg']}"]
    # Secrets and the database URL (its password) are not echoed.
    secret = "SecretStr" in repr(field.annotation) or name == "database_url"
    value = "<hidden>" if secret else repr(detail.get("input"))
    item = f" (item {detail['loc'][1] + 1})" if len(detail["loc"]) > 1 and isinstance(detail["loc"][1], int) else ""
    message = detail["msg"][0].lower() + detail["msg"][1:]
    return [f"{env_name(name)}={value}{item}: {message}; expected {expected(name)}"]
