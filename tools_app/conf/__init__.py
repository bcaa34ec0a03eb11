"""idemops's settings: one typed, validated, frozen object, read from the environment once.

The ground floor of tools_app (below `core`): it imports nothing of tools_app or idemops, so every
layer reads the settings without importing `idemops`, the public API's face. Apps import the same
names as `idemops.conf`, which re-exports them (one `conf()`, one cache: this module's).

Every setting is an environment variable `IDEMOPS_<NAME>`; the only unprefixed one is
DATABASE_URL (the universal convention). `idemops/settings.py` calls `load()` once at
start-up and builds Django's settings from the result; a bad value, an old variable name
(RENAMED) or an unknown IDEMOPS_ variable stops start-up with one line per problem,
naming the variable and what it expects. The code reads `conf().<field>`; tests replace
the object through Django's `settings` fixture with `override_conf(settings, ...)`.

- `fields.py`: every setting (type, unit, default, bounds, description) and RENAMED.
- `startup.py`: `load()`, and the refusal when the environment is wrong.
- `apps.py`: an app's own settings (`AppSettings`, `register_settings`), declared in its
  `idemops_settings` module, read and validated by `load()` with the platform's.
- `words.py`: what a field accepts, in words; docs/settings.md (`make settings-doc`,
  `python -m idemops.conf`, which runs `python -m tools_app.conf`; a test checks it is up to date).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from tools_app.conf.apps import AppSettings, register_settings
from tools_app.conf.apps import owner as _owner
from tools_app.conf.fields import (
    PREFIX,
    RENAMED,
    CrashPoint,
    HttpUrl,
    IdemopsSettings,
    Seconds,
    TextList,
    UrlList,
    env_name,
    environment_names,
    setting,
)
from tools_app.conf.startup import SettingsError, load
from tools_app.conf.words import expected, markdown

__all__ = ["PREFIX", "RENAMED", "AppSettings", "CrashPoint", "HttpUrl", "IdemopsSettings", "Seconds",
           "SettingsError", "TextList", "UrlList", "conf", "env_name", "environment_names", "expected", "load",
           "markdown", "override_conf", "register_settings", "setting"]


def conf() -> IdemopsSettings:
    """The settings of this process (Django's settings.IDEMOPS, built once by idemops/settings.py).

    Kept at hand once read: every attribute read through Django's lazy settings object costs a
    lookup, and the engine reads settings several times per call. A test's override of IDEMOPS
    (Django's setting_changed signal) drops it."""
    current = _current[0]
    if current is None:
        current = _current[0] = django_settings.IDEMOPS
    return current


_current: list[IdemopsSettings | None] = [None]


@receiver(setting_changed)
def _forget(*, setting: str, **_: Any) -> None:
    if setting == "IDEMOPS":
        _current[0] = None


def override_conf(settings: Any, **changes: Any) -> IdemopsSettings:
    """Replace settings.IDEMOPS by a validated copy with `changes` (field names), for tests: with
    pytest-django's `settings` fixture the original comes back after the test. A field of an app's
    settings (AppSettings) changes that app's values (settings.IDEMOPS_APPS) the same way."""
    current = settings.IDEMOPS
    # A name neither the platform nor an app has is left to the platform's validation, which refuses it.
    mine = {name: value for name, value in changes.items()
            if name in type(current).model_fields or _owner(name) is None}
    apps = dict(getattr(settings, "IDEMOPS_APPS", {}))
    for name, value in changes.items():
        model = _owner(name)
        if name in mine or model is None:
            continue
        values = apps.get(model) or model()
        apps[model] = type(values).model_validate({**values.model_dump(), name: value})
    settings.IDEMOPS_APPS = apps
    changed: IdemopsSettings = type(current).model_validate({**current.model_dump(), **mine})
    settings.IDEMOPS = changed
    _current[0] = None  # also where `settings` is Django's own object, which sends no setting_changed
    return changed
