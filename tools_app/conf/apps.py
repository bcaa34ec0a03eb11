"""An app's own settings: IDEMOPS_<NAME> variables the platform does not know, declared by the app.

An app (the demo, an adopter's) declares them in its `idemops_settings` module, which imports
pydantic and `idemops.conf` only (it is read while Django's settings are being built):

    from idemops.conf import AppSettings, register_settings, setting

    @register_settings
    class ShopSettings(AppSettings):
        title = "Shop (my_shop)"
        shop_gateway_url: str = setting("http://127.0.0.1:9000", "Base URL of the shop's gateway.")

and reads them with `ShopSettings.current()`. Start-up (`load()`) reads the `idemops_settings` module
of the demo and of every IDEMOPS_EXTRA_APPS app, so their variables are known (not refused as typos)
and each value is validated with the platform's, every problem on one line; `python -m idemops.conf
<app> ...` adds each app's section to the settings doc.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import ClassVar, Self, TypeVar

from django.conf import settings as django_settings

from tools_app.conf.fields import EnvironmentSettings, IdemopsSettings, env_name

SETTINGS_MODULE = "idemops_settings"
A = TypeVar("A", bound="AppSettings")

# Every registered app settings class, in registration order.
_REGISTERED: list[type[AppSettings]] = []
# The values start-up read (load()), by class: what `current()` answers when Django's settings hold none.
_LOADED: dict[type[AppSettings], AppSettings] = {}


class AppSettings(EnvironmentSettings):
    """The base of an app's settings: each field is the variable IDEMOPS_<NAME>, read once at start-up,
    typed, validated and frozen like the platform's. `title` heads the app's section of the doc;
    `renamed` maps the app's old variable names to the new ones (setting an old one stops start-up)."""

    title: ClassVar[str] = ""
    # Old variable names of the app's settings -> the new ones: setting an old one stops start-up.
    renamed: ClassVar[dict[str, str]] = {}

    @classmethod
    def current(cls) -> Self:
        """This process's values (start-up read them; a test replaces them with `override_conf`)."""
        loaded = getattr(django_settings, "IDEMOPS_APPS", _LOADED).get(cls)
        if loaded is None:
            raise LookupError(f"{cls.__name__} was not read at start-up: declare it in its app's "
                              f"`{SETTINGS_MODULE}` module with @register_settings")
        assert isinstance(loaded, cls), "IDEMOPS_APPS maps each class to its own values"
        return loaded


def register_settings(cls: type[A]) -> type[A]:
    """Make an app's settings known to start-up (a class decorator). A variable the platform or another
    app already reads is refused: one name, one meaning."""
    taken = {env_name(name): "the platform" for name in IdemopsSettings.model_fields}
    for other in _REGISTERED:
        if other is not cls and other.__qualname__ != cls.__qualname__:
            taken |= {env_name(name, other): other.__name__ for name in other.model_fields}
    clashes = [f"{env_name(name, cls)} (read by {taken[env_name(name, cls)]})" for name in cls.model_fields
               if env_name(name, cls) in taken]
    if clashes:
        raise ValueError(f"{cls.__name__} declares variables already read: {', '.join(clashes)}")
    # A module imported twice (its tests reload it) registers its class once.
    _REGISTERED[:] = [other for other in _REGISTERED if other.__qualname__ != cls.__qualname__
                      or other.__module__ != cls.__module__]
    _REGISTERED.append(cls)
    return cls


def registered() -> list[type[AppSettings]]:
    return list(_REGISTERED)


def discover(apps: list[str]) -> list[type[AppSettings]]:
    """Import each app's `idemops_settings` module (where it has one): its classes register themselves.
    Returns the classes those apps declare."""
    found = []
    for app in apps:
        module = f"{app}.{SETTINGS_MODULE}"
        if importlib.util.find_spec(app) is None or importlib.util.find_spec(module) is None:
            continue
        imported = importlib.import_module(module)
        found += [cls for cls in _REGISTERED if cls.__module__ == imported.__name__]
    return found


def loaded() -> dict[type[AppSettings], AppSettings]:
    """Every app's values start-up read: idemops/settings.py keeps them as Django's IDEMOPS_APPS."""
    return dict(_LOADED)


def remember(values: dict[type[AppSettings], AppSettings]) -> None:
    _LOADED.clear()
    _LOADED.update(values)


def owner(field_name: str) -> type[AppSettings] | None:
    """The registered app settings class with this field, if one has it."""
    return next((cls for cls in _REGISTERED if field_name in cls.model_fields), None)
