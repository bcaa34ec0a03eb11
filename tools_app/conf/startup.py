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

from tools_app.conf import apps as app_settings
from tools_app.conf.fields import PREFIX, RENAMED, EnvironmentSettings, IdemopsSettings, env_name, environment_names
from tools_app.conf.words import expected


class SettingsError(Exception):
    """Settings idemops cannot start with; one line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join([
            f"idemops cannot start: {len(problems)} problem{'s' if len(problems) > 1 else ''} with its settings "
            "(every setting is described in docs/settings.md)",
            *(f"  - {problem}" for problem in problems)]))


def load(apps: typing.Sequence[str] = ()) -> IdemopsSettings:
    """The settings from the environment, or SettingsError listing every problem found.

    `apps` (and IDEMOPS_EXTRA_APPS) are the apps whose own settings (their `idemops_settings` module,
    tools_app.conf.apps) are read too: their variables are known, and their values validated here."""
    problems = []
    try:
        loaded = IdemopsSettings()
    except ValidationError as error:
        problems += [line for detail in error.errors(include_url=False) for line in _describe(detail)]
        loaded = None
    # The extra apps are known even when another platform value is wrong: every problem is told at once.
    extra_apps = loaded.extra_apps if loaded is not None else [
        app.strip() for app in os.environ.get(env_name("extra_apps"), "").split(",") if app.strip()]
    declared = app_settings.discover([*apps, *extra_apps])
    problems = _old_names(os.environ, declared) + problems + _unknown_names(os.environ, declared)
    values: dict[type[app_settings.AppSettings], app_settings.AppSettings] = {}
    for model in declared:
        try:
            values[model] = model()
        except ValidationError as error:
            problems += [line for detail in error.errors(include_url=False) for line in _describe(detail, model)]
    if problems:
        raise SettingsError(problems)
    assert loaded is not None, "every validation error is described as a problem"
    app_settings.remember(values)
    return loaded


def _old_names(environ: typing.Mapping[str, str],
               declared: typing.Sequence[type[app_settings.AppSettings]] = ()) -> list[str]:
    renamed = {**RENAMED, **{old: new for model in declared for old, new in model.renamed.items()}}
    return [f"{old} is no longer read: set {new} instead"
            for old, new in renamed.items() if old in environ]


def _unknown_names(environ: typing.Mapping[str, str],
                   declared: typing.Sequence[type[EnvironmentSettings]] = ()) -> list[str]:
    known = environment_names() | {env_name(name, model): name for model in declared for name in model.model_fields}
    problems = []
    for name in sorted(environ):
        if name.upper().startswith(PREFIX) and name.upper() not in known:
            close = difflib.get_close_matches(name.upper(), known, n=1, cutoff=0.8)
            hint = f" (did you mean {close[0]}?)" if close else ""
            problems.append(f"{name} is not an idemops setting{hint}")
    return problems


def _describe(detail: ErrorDetails, model: type[EnvironmentSettings] = IdemopsSettings) -> list[str]:
    if detail["type"] == "default_factory_not_called":
        return []  # a consequence of another field's error, reported on its own line
    if not detail["loc"]:
        return detail["msg"].split("\n")
    first = str(detail["loc"][0])  # a setting's name: a top-level location is never a list index
    name = environment_names().get(first, first) if model is IdemopsSettings else first  # an alias or a name
    field = model.model_fields.get(name)
    if field is None:
        return [f"{name}: {detail['msg']}"]
    # Secrets and the database URL (its password) are not echoed.
    secret = "SecretStr" in repr(field.annotation) or name == "database_url"
    value = "<hidden>" if secret else repr(detail.get("input"))
    item = f" (item {detail['loc'][1] + 1})" if len(detail["loc"]) > 1 and isinstance(detail["loc"][1], int) else ""
    message = detail["msg"][0].lower() + detail["msg"][1:]
    return [f"{env_name(name, model)}={value}{item}: {message}; expected {expected(name, model)}"]
