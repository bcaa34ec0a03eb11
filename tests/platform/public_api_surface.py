"""The public tool API's surface, as text: one line per name, with its signature (functions and
classes), its fields (models and dataclasses) or its members (enums). tests/platform/test_public_api.py compares
it with public_api_surface.txt; `python -m tests.platform.public_api_surface` prints it anew."""

from __future__ import annotations

import dataclasses
import enum
import inspect


def describe(name: str, obj: object) -> str:
    if isinstance(obj, str):
        return f"{name} = {obj!r}"
    if isinstance(obj, type) and hasattr(obj, "_meta") and hasattr(obj._meta, "concrete_fields"):
        return f"{name}: django model {sorted(field.name for field in obj._meta.concrete_fields)}"
    if isinstance(obj, type) and issubclass(obj, enum.Enum):
        return f"{name}: enum {sorted(member.value for member in obj)}"
    if isinstance(obj, type) and hasattr(obj, "model_fields"):
        fields = ", ".join(f"{field}: {info.annotation!r}" for field, info in obj.model_fields.items())
        return f"{name}: model ({fields})"
    if isinstance(obj, type) and dataclasses.is_dataclass(obj):
        fields = ", ".join(f"{field.name}: {field.type}" for field in dataclasses.fields(obj))
        properties = sorted(attr for attr, value in vars(obj).items() if isinstance(value, property))
        return f"{name}: dataclass ({fields}) properties {properties}"
    if isinstance(obj, type) and issubclass(obj, BaseException):
        return f"{name}: exception {[base.__name__ for base in obj.__mro__[1:-2]]}"
    if isinstance(obj, type):
        methods = sorted(attr for attr in vars(obj) if not attr.startswith("_"))
        return f"{name}: class {methods}"
    try:
        return f"{name}{inspect.signature(obj)}"
    except (TypeError, ValueError):
        return f"{name}: {type(obj).__name__}"


def surface() -> list[str]:
    from idemops import tools

    return [describe(name, getattr(tools, name)) for name in sorted(tools.__all__)]


if __name__ == "__main__":
    import os

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "idemops.settings")
    django.setup()
    print("\n".join(surface()))
