"""The settings object (tools_app/conf/; apps import it as idemops.conf): read once, typed, validated;
a bad environment stops start-up.

The start-up tests run real processes (manage.py, uvicorn, qcluster) with a crafted
environment and read what they print and how they exit.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from pydantic import ValidationError

from idemops_demo.idemops_settings import DemoSettings
from tools_app import conf as conf_module
from tools_app.conf import RENAMED, IdemopsSettings, conf, env_name, environment_names, override_conf
from tools_app.conf.apps import discover

ROOT = Path(__file__).resolve().parents[2]
# Never reached: `manage.py check` and a refused start-up do not connect.
UNREACHABLE_DATABASE = "postgresql://idemops@127.0.0.1:1/never"


def start(argv: list[str], **env: str) -> subprocess.CompletedProcess:
    """Run an idemops entry point with only `env` set (plus what Python needs)."""
    base = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**base, "DJANGO_SETTINGS_MODULE": "idemops.settings",
                               "DATABASE_URL": UNREACHABLE_DATABASE, **env})


def check(**env: str) -> subprocess.CompletedProcess:
    return start(["manage.py", "check"], **env)


def problems(process: subprocess.CompletedProcess) -> list[str]:
    """The lines of the refusal, one per problem."""
    assert process.returncode == 1, (process.returncode, process.stdout, process.stderr)
    assert "Traceback" not in process.stderr, process.stderr
    head, *lines = process.stderr.strip().splitlines()
    assert head.startswith("idemops cannot start:"), process.stderr
    return [line.removeprefix("  - ") for line in lines]


# --- start-up -------------------------------------------------------------------------------------


def test_the_same_process_starts_when_every_value_is_good():
    process = check(IDEMOPS_Q_WORKERS="3", IDEMOPS_EXECUTION_LEASE_SECONDS="4", IDEMOPS_LOG_LEVEL="warning",
                    IDEMOPS_WEBHOOK_ALLOWED_PREFIXES="http://hooks.example/a/, https://hooks.example/b/",
                    IDEMOPS_CRASH_POINTS="")

    assert process.returncode == 0, process.stderr
    assert "System check identified no issues" in process.stdout


def test_bad_values_stop_manage_py_with_one_line_each_naming_the_variable_and_what_it_expects():
    lines = problems(check(IDEMOPS_EXECUTION_LEASE_SECONDS="ten", IDEMOPS_Q_WORKERS="0", IDEMOPS_PORT="70000",
                           IDEMOPS_DEBUG="perhaps", IDEMOPS_PAYMENT_GATEWAY_URL="gateway:8001",
                           IDEMOPS_DOCUMENT_ALLOWED_URL_PREFIXES="https://docs.example/,ftp://docs.example/",
                           IDEMOPS_CRASH_POINTS="after_lunch"))

    assert sorted(lines) == sorted([
        "IDEMOPS_EXECUTION_LEASE_SECONDS='ten': input should be a valid number, unable to parse string as a "
        "number; expected a number of seconds > 0",
        "IDEMOPS_Q_WORKERS='0': input should be greater than or equal to 1; expected an integer >= 1",
        "IDEMOPS_PORT='70000': input should be less than or equal to 65535; expected a port number, 1 to 65535",
        "IDEMOPS_DEBUG='perhaps': input should be a valid boolean, unable to interpret input; expected true or false",
        "IDEMOPS_PAYMENT_GATEWAY_URL='gateway:8001': not an http:// or https:// URL with a host; expected an "
        "http(s) URL",
        "IDEMOPS_DOCUMENT_ALLOWED_URL_PREFIXES='ftp://docs.example/' (item 2): not an http:// or https:// URL "
        "with a host; expected a comma-separated list of http(s) URLs",
        "IDEMOPS_CRASH_POINTS='after_lunch' (item 1): input should be 'after_claim', 'after_downstream', "
        "'after_commit', 'after_checkpoint', 'after_batch' or 'in_compensation'; expected a comma-separated list "
        "(each one of after_claim, after_downstream, after_commit, after_checkpoint, after_batch, in_compensation)",
    ])


@pytest.mark.parametrize("argv", [["manage.py", "qcluster"],
                                  ["-m", "uvicorn", "idemops.asgi:application", "--port", "0"]],
                         ids=["qcluster", "uvicorn"])
def test_the_job_cluster_and_the_web_server_stop_on_a_bad_value_with_the_same_message(argv):
    lines = problems(start(argv, IDEMOPS_TASK_LEASE_SECONDS="-5"))

    assert lines == ["IDEMOPS_TASK_LEASE_SECONDS='-5': input should be greater than 0; "
                     "expected a number of seconds > 0"]


def test_an_old_variable_name_stops_start_up_naming_the_new_one():
    lines = problems(check(Q_WORKERS="4", DJANGO_SECRET_KEY="s3cret-value", NOTIFICATION_WEBHOOK_ALLOWED_PREFIXES="x"))

    assert sorted(lines) == [
        "DJANGO_SECRET_KEY is no longer read: set IDEMOPS_SECRET_KEY instead",
        "NOTIFICATION_WEBHOOK_ALLOWED_PREFIXES is no longer read: set IDEMOPS_WEBHOOK_ALLOWED_PREFIXES instead",
        "Q_WORKERS is no longer read: set IDEMOPS_Q_WORKERS instead",
    ]


def test_a_misspelt_idemops_variable_stops_start_up_with_the_closest_setting():
    lines = problems(check(IDEMOPS_EXECUTION_LEASE_SECOND="4", IDEMOPS_NO_SUCH_THING="1"))

    assert lines == [
        "IDEMOPS_EXECUTION_LEASE_SECOND is not an idemops setting (did you mean IDEMOPS_EXECUTION_LEASE_SECONDS?)",
        "IDEMOPS_NO_SUCH_THING is not an idemops setting",
    ]


def test_settings_that_contradict_each_other_stop_start_up():
    lines = problems(check(IDEMOPS_EXECUTION_LEASE_SECONDS="2", IDEMOPS_TASK_HEARTBEAT_SECONDS="90",
                           IDEMOPS_TASK_BACKOFF_BASE_SECONDS="400", IDEMOPS_Q_TIMEOUT_SECONDS="60",
                           IDEMOPS_TASK_SLICE_SECONDS="60"))

    assert lines == [
        "IDEMOPS_EXECUTION_HEARTBEAT_SECONDS=2 must be less than IDEMOPS_EXECUTION_LEASE_SECONDS=2: a lease must be "
        "renewed before it runs out",
        "IDEMOPS_TASK_HEARTBEAT_SECONDS=90 must be less than IDEMOPS_TASK_LEASE_SECONDS=10: a lease must be renewed "
        "before it runs out",
        "IDEMOPS_TASK_BACKOFF_BASE_SECONDS=400 is more than IDEMOPS_TASK_BACKOFF_MAX_SECONDS=300: the base of a "
        "backoff cannot exceed its ceiling",
        "IDEMOPS_TASK_SLICE_SECONDS=60 must be less than IDEMOPS_Q_TIMEOUT_SECONDS=60: a job must hand its task on "
        "before django-q2 kills it",
    ]


def test_a_refusal_does_not_print_a_secret_or_the_database_password():
    process = check(DATABASE_URL="mysql://root:hunter2@db.example/idemops", IDEMOPS_SECRET_KEY_FALLBACKS="",
                    IDEMOPS_KEY_DIGEST_SECRET="", IDEMOPS_EMAIL_PORT="smtp")
    lines = problems(process)

    assert "DATABASE_URL=<hidden>: idemops runs on PostgreSQL only; expected a PostgreSQL URL" in lines
    assert "hunter2" not in process.stderr + process.stdout


# --- the object -----------------------------------------------------------------------------------


def test_lists_are_read_comma_separated_and_an_empty_one_is_empty(monkeypatch):
    monkeypatch.setenv("IDEMOPS_OUTBOUND_PRIVATE_HOSTS", " hooks.internal, ,docs.internal ")
    monkeypatch.setenv("IDEMOPS_DOCUMENT_ALLOWED_DIRS", "")

    read = IdemopsSettings()

    assert read.outbound_private_hosts == ["hooks.internal", "docs.internal"]
    assert DemoSettings().document_allowed_dirs == []  # an app's settings read lists the same way


def test_the_task_slice_defaults_to_half_of_django_q2s_timeout_which_redelivers_after_the_queue_wait(monkeypatch):
    monkeypatch.setenv("IDEMOPS_Q_TIMEOUT_SECONDS", "100")
    monkeypatch.delenv("IDEMOPS_TASK_SLICE_SECONDS", raising=False)

    assert IdemopsSettings().task_slice_seconds == 50
    assert django_settings.Q_CLUSTER["retry"] == (conf().q_timeout_seconds + conf().q_expected_queue_wait_seconds)
    monkeypatch.setenv("IDEMOPS_Q_EXPECTED_QUEUE_WAIT_SECONDS", "0")
    with pytest.raises(conf_module.SettingsError, match="IDEMOPS_Q_EXPECTED_QUEUE_WAIT_SECONDS='0'"):
        conf_module.load()


def test_django_settings_are_built_from_the_object():
    assert django_settings.SECRET_KEY == conf().secret_key.get_secret_value()
    assert django_settings.EMAIL_TIMEOUT == conf().email_timeout_seconds
    assert django_settings.DATABASES["default"]["CONN_MAX_AGE"] == conf().db_conn_max_age_seconds
    assert conf().database_url  # the server actually used, embedded or not


def test_the_object_is_frozen_and_an_override_is_validated_like_the_environment(settings):
    with pytest.raises(ValidationError, match="frozen"):
        conf().outbox_max_attempts = 3
    with pytest.raises(ValidationError, match="outbox_max_attempts"):
        override_conf(settings, outbox_max_attempts=0)
    with pytest.raises(ValidationError, match="no_such_setting"):
        override_conf(settings, no_such_setting=1)

    override_conf(settings, outbox_max_attempts=3)

    assert conf().outbox_max_attempts == 3


def test_secrets_do_not_show_in_the_objects_repr():
    shown = repr(conf())

    assert conf().secret_key.get_secret_value() not in shown
    assert conf().key_digest_secret.get_secret_value() not in shown


def test_every_old_name_points_at_a_setting_that_exists_and_none_is_a_setting_itself():
    names = set(environment_names())
    demo_names = {env_name(field, DemoSettings) for field in DemoSettings.model_fields}

    assert [new for new in RENAMED.values() if new not in names] == []
    assert [old for old in RENAMED if old in names | demo_names] == []
    assert [new for new in DemoSettings.renamed.values() if new not in demo_names] == []
    assert [old for old in DemoSettings.renamed if old in names | demo_names] == []


def test_an_apps_old_names_stop_start_up_like_the_platforms():
    assert problems(check(PAYMENT_GATEWAY_URL="http://gateway.test")) == [
        "PAYMENT_GATEWAY_URL is no longer read: set IDEMOPS_PAYMENT_GATEWAY_URL instead"]


def test_every_setting_is_prefixed_but_the_database_url_and_opentelemetrys_own():
    assert [name for name in environment_names()
            if not name.startswith(("IDEMOPS_", "OTEL_"))] == ["DATABASE_URL"]


def test_the_settings_reference_is_generated_from_the_object_and_up_to_date():
    """docs/settings.md: regenerate with `make settings-doc`."""
    doc = (ROOT / "docs" / "settings.md").read_text()

    assert doc == conf_module.markdown(discover(["idemops_demo"]))
    for name in [*environment_names(), *(env_name(field, DemoSettings) for field in DemoSettings.model_fields)]:
        assert len([line for line in doc.splitlines() if line.startswith(f"| `{name}` |")]) == 1, name


# Modules that touch os.environ for another reason than reading a setting.
ENVIRONMENT_WRITERS = {
    "idemops/settings.py": "passes the embedded server's DATABASE_URL on to child processes",
    "idemops/test_settings.py": "points the test run at its own embedded server (var/test-pg)",
}


def test_no_module_but_the_settings_object_reads_the_environment():
    readers = []
    for directory in ("idemops", "tools_app"):
        for source in (ROOT / directory).rglob("*.py"):
            relative = str(source.relative_to(ROOT))
            if relative.startswith("tools_app/conf/") or relative in ENVIRONMENT_WRITERS:
                continue
            for node in ast.walk(ast.parse(source.read_text())):
                if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv"):
                    readers.append(f"{relative}:{node.lineno}")
                if (isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ"
                        and isinstance(node.ctx, ast.Load)):
                    readers.append(f"{relative}:{node.lineno}")

    assert readers == []


def test_behind_a_pooler_in_transaction_mode_streamed_reads_can_do_without_server_side_cursors():
    show = ["manage.py", "shell", "-c", "from django.conf import settings; "
            "print(settings.DATABASES['default']['DISABLE_SERVER_SIDE_CURSORS'])"]

    assert start(show).stdout.split()[-1] == "False"
    assert start(show, IDEMOPS_DB_DISABLE_SERVER_SIDE_CURSORS="true").stdout.split()[-1] == "True"


def test_local_state_defaults_to_var_at_the_repository_root(monkeypatch):
    monkeypatch.delenv("IDEMOPS_VAR_DIR", raising=False)
    assert IdemopsSettings().var_dir == ROOT / "var"


def test_the_models_and_the_migrations_agree():
    process = start(["manage.py", "makemigrations", "--check", "--dry-run"])
    assert process.returncode == 0, process.stdout + process.stderr


def test_conf_follows_every_change_of_the_settings_object(settings):
    """conf() keeps the settings object at hand once read: a test's override (Django's setting_changed)
    and override_conf on Django's own settings (a benchmark's) are both seen at once."""
    before = conf().follower_wait_seconds
    override_conf(settings, follower_wait_seconds=before + 1)
    assert conf().follower_wait_seconds == before + 1
    original = django_settings.IDEMOPS
    try:
        override_conf(django_settings, follower_wait_seconds=before + 2)  # no signal: Django's own object
        assert conf().follower_wait_seconds == before + 2
    finally:
        django_settings.IDEMOPS = original
        conf_module._current[0] = None
    assert conf() is original


def test_idemops_conf_is_the_ground_floors_settings_under_the_name_apps_import(settings):
    """Apps import the settings as idemops.conf (docs/adopting.md); they live in tools_app.conf, below core.
    The names are the same objects, so there is one conf() and one kept object: an override through
    either name is seen through the other, and `python -m idemops.conf` writes the same doc."""
    import idemops.conf as public

    assert public.__all__ == conf_module.__all__
    assert all(getattr(public, name) is getattr(conf_module, name) for name in public.__all__)
    before = conf().follower_wait_seconds
    public.override_conf(settings, follower_wait_seconds=before + 3)
    assert conf().follower_wait_seconds == public.conf().follower_wait_seconds == before + 3
    doc = subprocess.run([sys.executable, "-m", "idemops.conf", "idemops_demo"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert doc == conf_module.markdown(discover(["idemops_demo"]))


# --- an app's own settings (idemops.conf.AppSettings) ---------------------------------------------

SHOP_SETTINGS = """
from idemops.conf import AppSettings, HttpUrl, Seconds, register_settings, setting


@register_settings
class ShopSettings(AppSettings):
    title = "Shop"
    shop_gateway_url: HttpUrl = setting("http://127.0.0.1:9000", "Base URL of the shop's gateway.")
    shop_timeout_seconds: Seconds = setting(5, "Timeout of one gateway request.")
"""


@pytest.fixture
def shop_app(tmp_path):
    """An adopter's app (IDEMOPS_EXTRA_APPS=shop) that declares its own settings, nothing else."""
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "idemops_settings.py").write_text(SHOP_SETTINGS)
    return {"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "IDEMOPS_EXTRA_APPS": "shop", "IDEMOPS_DEMO": "0"}


def test_an_apps_own_settings_are_read_at_start_up_from_their_variables(shop_app):
    show = ["manage.py", "shell", "-c", "from shop.idemops_settings import ShopSettings; "
            "print(ShopSettings.current().shop_gateway_url, ShopSettings.current().shop_timeout_seconds)"]

    process = start(show, **shop_app, IDEMOPS_SHOP_GATEWAY_URL="https://gateway.shop.test")

    assert process.returncode == 0, process.stderr
    assert process.stdout.split()[-2:] == ["https://gateway.shop.test", "5.0"]


def test_an_apps_bad_values_and_typos_stop_start_up_with_the_platforms(shop_app):
    lines = problems(check(**shop_app, IDEMOPS_SHOP_TIMEOUT_SECONDS="soon", IDEMOPS_SHOP_GATEWAY_ULR="x",
                           IDEMOPS_Q_WORKERS="0"))

    assert sorted(lines) == sorted([
        "IDEMOPS_SHOP_GATEWAY_ULR is not an idemops setting (did you mean IDEMOPS_SHOP_GATEWAY_URL?)",
        "IDEMOPS_SHOP_TIMEOUT_SECONDS='soon': input should be a valid number, unable to parse string as a number; "
        "expected a number of seconds > 0",
        "IDEMOPS_Q_WORKERS='0': input should be greater than or equal to 1; expected an integer >= 1",
    ])


def test_without_the_app_its_variables_are_unknown(shop_app):
    lines = problems(check(**{**shop_app, "IDEMOPS_EXTRA_APPS": ""}, IDEMOPS_SHOP_TIMEOUT_SECONDS="3"))

    assert len(lines) == 1 and lines[0].startswith("IDEMOPS_SHOP_TIMEOUT_SECONDS is not an idemops setting"), lines


def test_the_demos_variables_still_start_a_server_with_the_demo_off():
    """An existing deployment that set the demo's variables and turns it off keeps starting."""
    process = check(IDEMOPS_DEMO="0", IDEMOPS_PAYMENT_GATEWAY_TIMEOUT_SECONDS="10", IDEMOPS_RUN_DEMO_DOWNSTREAMS="0")

    assert process.returncode == 0, process.stderr


def test_an_app_may_not_take_a_variable_the_platform_reads():
    from tools_app.conf import AppSettings, register_settings, setting

    class Clash(AppSettings):
        q_workers: int = setting(2, "Taken.")

    with pytest.raises(ValueError, match=r"IDEMOPS_Q_WORKERS \(read by the platform\)"):
        register_settings(Clash)


def test_override_conf_changes_an_apps_settings_in_a_test(settings):
    override_conf(settings, document_max_bytes=1024, q_workers=3)

    assert DemoSettings.current().document_max_bytes == 1024
    assert conf().q_workers == 3
    with pytest.raises(ValidationError, match="document_max_bytes"):
        override_conf(settings, document_max_bytes=0)
