"""`python -m idemops.conf [app ...]`: the settings reference, docs/settings.md (`make settings-doc`);
it runs `python -m tools_app.conf`, where the settings live."""

import runpy

runpy.run_module("tools_app.conf", run_name="__main__", alter_sys=True)
