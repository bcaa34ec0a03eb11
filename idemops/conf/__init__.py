"""The settings, under the name an app imports: `idemops.conf` (docs/adopting.md, docs/tools-api.md).

The settings live on the platform's ground floor, `tools_app/conf/` (below `core`, importing nothing
of tools_app), so every layer reads them without importing `idemops`, the public API's face. This
module only re-exports their public names: `conf()` and its cache are `tools_app.conf`'s, one object.
`python -m idemops.conf [app ...]` writes docs/settings.md (`make settings-doc`).
"""

from tools_app.conf import (
    PREFIX,
    RENAMED,
    AppSettings,
    CrashPoint,
    HttpUrl,
    IdemopsSettings,
    Seconds,
    SettingsError,
    TextList,
    UrlList,
    conf,
    env_name,
    environment_names,
    expected,
    load,
    markdown,
    override_conf,
    register_settings,
    setting,
)

__all__ = ["PREFIX", "RENAMED", "AppSettings", "CrashPoint", "HttpUrl", "IdemopsSettings", "Seconds",
           "SettingsError", "TextList", "UrlList", "conf", "env_name", "environment_names", "expected", "load",
           "markdown", "override_conf", "register_settings", "setting"]
