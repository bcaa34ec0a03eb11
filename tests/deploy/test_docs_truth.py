"""README.md and docs/*.md say only what exists: paths, commands, settings, error classes, endpoints, defaults.

Docs rot quietly: a file is renamed, a setting's default changes, an error
class is added and nobody updates the table. These checks read the docs the
way a user would act on them (open this file, run this command, set this
variable, call this endpoint) and fail naming the doc and the stale mention.
"""

from __future__ import annotations

import ast
import importlib
import io
import json
import re
import subprocess
import sys
import tokenize
from datetime import timedelta
from pathlib import Path

import httpx2
import pytest
from django.core.management import get_commands
from django.db import transaction
from django.urls import Resolver404, resolve
from django.utils import timezone

from tests.support.processes import Service, child_env, downstream_env, free_port
from tools_app import engine
from tools_app.core.errors import ErrorClass
from tools_app.models import IdempotencyRecord, RecordStatus, Tenant
from tools_app.toolkit.calls import Caller, validate_arguments, write_operation
from tools_app.toolkit.registry import get_tool

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE_DIRS = ("idemops", "tools_app", "idemops_demo", "idemops_client", "bench")
TOP_LEVEL = ("idemops", "tools_app", "idemops_demo", "tests", "bench", "docs", "templates", ".ci", "deploy")


def text_of(doc: Path) -> str:
    return doc.read_text()


def name_of(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


def spans(text: str) -> list[str]:
    """The `inline code` spans of a Markdown text, and the lines of its fenced blocks."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    rest = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.findall(r"`([^`\n]+)`", rest) + [line for block in fenced for line in block.splitlines()]


def expand_braces(path: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    return [expanded for option in match.group(1).split(",")
            for expanded in expand_braces(path[:match.start()] + option + path[match.end():])]


# --- files --------------------------------------------------------------------------------------

PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(re.escape(d) for d in TOP_LEVEL)})/[\w./{{}},*-]*"
                  r"|manage\.py|Makefile|requirements\.txt|pyproject\.toml)")


@pytest.mark.parametrize("doc", DOCS, ids=name_of)
def test_every_file_path_a_doc_mentions_exists(doc):
    missing = []
    for mention in PATH.findall(text_of(doc)):
        for path in expand_braces(mention.rstrip(".,")):
            if "*" in path:
                found = list(ROOT.glob(path))
            else:
                found = [ROOT / path] if (ROOT / path).exists() else []
            if not found:
                missing.append(path)
    assert not missing, f"{name_of(doc)} mentions paths that do not exist: {sorted(set(missing))}"


@pytest.mark.parametrize("doc", DOCS, ids=name_of)
def test_every_link_to_another_doc_resolves(doc):
    links = re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", text_of(doc))
    broken = [link for link in links if not (doc.parent / link).exists()]
    assert not broken, f"{name_of(doc)} links to files that do not exist: {broken}"


def heading_anchors(doc: Path) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings (lower case, punctuation dropped, spaces as
    hyphens, a repeated heading numbered), and the explicit `<a id=…>`/`<a name=…>` ones."""
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.MULTILINE | re.DOTALL)
    anchors: set[str] = set(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", text))
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


@pytest.mark.parametrize("doc", DOCS, ids=name_of)
def test_every_link_to_a_section_finds_its_heading(doc):
    links = re.findall(r"\]\(([^)#:\s]*)#([^)\s]+)\)", text_of(doc))
    targets = {target: doc.parent / target if target else doc for target, _ in links}
    broken = [f"{target}#{anchor}" for target, anchor in links
              if targets[target].suffix == ".md" and targets[target].is_file()
              and anchor not in heading_anchors(targets[target])]
    assert not broken, f"{name_of(doc)} links to sections that do not exist: {broken}"


def permission_names() -> set[str]:
    """`tools_app.<codename>` of every permission the app's models declare (custom and default)."""
    from django.apps import apps

    names = set()
    for model in apps.get_app_config("tools_app").get_models():
        opts = model._meta
        names |= {codename for codename, _ in opts.permissions}
        names |= {f"{action}_{opts.model_name}" for action in opts.default_permissions}
    return {f"tools_app.{name}" for name in names}


def test_names_permissions_and_test_functions_the_docs_cite_exist():
    """`tools_app.x.y` is a module attribute or a permission; `test_…` names are tests in tests/."""
    tests_source = "\n".join(p.read_text() for pattern in ("test_*.py", "*/test_*.py")
                             for p in (ROOT / "tests").glob(pattern))
    permissions = permission_names()
    problems = []
    for doc in DOCS:
        for span in spans(text_of(doc)):
            for dotted in re.findall(r"(?<![\w.])(tools_app(?:\.\w+)+)", span):
                if dotted not in permissions and not _resolves(dotted):
                    problems.append(f"{name_of(doc)}: {dotted}")
            for test in re.findall(r"(?<![\w.])(test_\w+)(?![\w.])", span):
                if f"def {test}(" not in tests_source:
                    problems.append(f"{name_of(doc)}: {test}")
    assert not problems, problems


def prose_of(path) -> str:
    """The docstrings and comments of a Python file: where it talks about other code in words."""
    source = path.read_text()
    tree = ast.parse(source)
    docstrings = [ast.get_docstring(node) or "" for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    comments = [token.string for token in tokenize.generate_tokens(io.StringIO(source).readline)
                if token.type == tokenize.COMMENT]
    return "\n".join(docstrings + comments)


def test_every_dotted_name_the_codes_docstrings_and_comments_cite_exists():
    """A docstring or comment that names `tools_app.x.y` or `idemops.x` points at something real."""
    permissions = permission_names()
    problems = []
    for path in sorted([*(ROOT / "tools_app").rglob("*.py"), *(ROOT / "idemops").rglob("*.py")]):
        if "migrations" in path.parts:
            continue
        for dotted in re.findall(r"(?<![\w.])((?:tools_app|idemops)(?:\.\w+)+)", prose_of(path)):
            if dotted not in permissions and not _resolves(dotted.rstrip(".")):
                problems.append(f"{path.relative_to(ROOT)}: {dotted}")
    assert not problems, problems


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


# --- commands -------------------------------------------------------------------------------------


def test_every_command_the_docs_mention_exists():
    commands = set(get_commands())
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    problems = []
    for doc in DOCS:
        text = text_of(doc)
        problems += [f"{name_of(doc)}: manage.py {c}" for c in re.findall(r"manage\.py (\w+)", text)
                     if c not in commands]
        problems += [f"{name_of(doc)}: make {t}" for t in re.findall(r"`make ([\w-]+)", text) if t not in targets]
        problems += [f"{name_of(doc)}: make {t}" for line in spans(text)
                     for t in re.findall(r"^make ([\w-]+)", line) if t not in targets]
    assert not problems, f"commands that do not exist: {problems}"


# --- error classes ----------------------------------------------------------------------------------


def error_table_classes(text: str) -> list[list[str]]:
    """For each Markdown table with a `Class` column: the backticked names in that column."""
    tables = []
    for table in re.findall(r"(?:^\|.*\|\n)+", text, re.MULTILINE):
        rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.strip().splitlines()]
        header = [cell.lower() for cell in rows[0]]
        if "class" in header:
            column = header.index("class")
            # (Parenthesised remarks may name fields, e.g. `differing_fields`.)
            tables.append([name for row in rows[2:]
                           for name in re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", row[column]))])
    return tables


def test_the_readme_error_table_lists_exactly_the_error_classes_there_are():
    tables = error_table_classes(text_of(ROOT / "README.md"))

    assert tables, "README.md has no error-class table"
    assert sorted(tables[0]) == sorted(ErrorClass.values)


@pytest.mark.parametrize("doc", DOCS, ids=name_of)
def test_every_error_class_a_doc_names_exists(doc):
    text = text_of(doc)
    named = [name for table in error_table_classes(text) for name in table]
    named += re.findall(r"(?:error\.class|error class|class) ?=? ?`(\w+)`", text)
    named += re.findall(r"`(\w+)` class\b", text)
    unknown = sorted(set(named) - set(ErrorClass.values))
    assert not unknown, f"{name_of(doc)} names error classes that do not exist: {unknown}"


# --- settings -----------------------------------------------------------------------------------------


def settings_read() -> dict[str, object]:
    """Every environment variable the code reads, with its default where it is a constant.

    idemops's settings are the fields of tools_app/conf/fields.py and the demo's own (idemops_demo/idemops_settings.py,
    registered through idemops.conf); the only other variables are the test
    suite's and the benchmarks' own (read with os.environ)."""
    from idemops_demo.idemops_settings import DemoSettings
    from tools_app.conf import IdemopsSettings, env_name

    found: dict[str, object] = {env_name(name, model): None if field.default_factory else field.default
                                for model in (IdemopsSettings, DemoSettings)
                                for name, field in model.model_fields.items()}
    for directory in CODE_DIRS:
        for source in (ROOT / directory).rglob("*.py"):
            for node in ast.walk(ast.parse(source.read_text())):
                if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                        and isinstance(node.args[0].value, str)):
                    continue
                function = ast.unparse(node.func)
                if function in ("os.environ.get", "os.getenv", "os.environ.setdefault", "os.environ.__getitem__"):
                    found.setdefault(node.args[0].value, None)
            for name in re.findall(r"os\.environ\[\"([A-Z][A-Z0-9_]+)\"\]", source.read_text()):
                found.setdefault(name, None)
    return found


def code_constants() -> set[str]:
    """Upper-case names the code defines (module constants, enum members such as AWAITING_APPROVAL)."""
    names = set()
    for directory in CODE_DIRS:
        for source in (ROOT / directory).rglob("*.py"):
            for node in ast.walk(ast.parse(source.read_text())):
                targets = node.targets if isinstance(node, ast.Assign) else (
                    [node.target] if isinstance(node, ast.AnnAssign) else [])
                names |= {t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()}
    return names


def known_setting_names() -> set[str]:
    """Environment variables, Django's setting names, constants of the code, the Makefile's variables
    (`make test TEST_WORKERS=0`), and the old names of renamed variables (which only docs/settings.md may
    mention: see the test below)."""
    from django.conf import settings

    from idemops_demo.idemops_settings import DemoSettings
    from tools_app.conf import RENAMED as PLATFORM_RENAMED

    RENAMED = {**PLATFORM_RENAMED, **DemoSettings.renamed}

    makefile_variables = set(re.findall(r"^([A-Z][A-Z0-9_]*) *\?=", (ROOT / "Makefile").read_text(), re.MULTILINE))
    return (set(settings_read()) | {name for name in dir(settings) if name.isupper()} | code_constants()
            | set(RENAMED) | makefile_variables)


SETTING = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")
# Django's own environment variables (`createsuperuser --noinput` reads the password from one).
DJANGO_ENVIRONMENT = {"DJANGO_SETTINGS_MODULE", "DJANGO_SUPERUSER_PASSWORD"}


def own_code_names(text: str) -> set[str]:
    """Names a page's own files define or read (a tutorial's `file=` blocks: an adopter's code, which
    tests/platform/test_adopting.py writes and runs)."""
    files = re.findall(r"^```\w+ file=[^\n]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    return {token for body in files for token in re.findall(r"\b[A-Z][A-Z0-9_]+\b", body)}


@pytest.mark.parametrize("doc", DOCS, ids=name_of)
def test_every_setting_a_doc_names_is_read_by_the_code(doc):
    known = known_setting_names() | DJANGO_ENVIRONMENT | own_code_names(text_of(doc))
    named = {token for span in spans(text_of(doc)) for token in re.findall(r"\b[A-Z][A-Z0-9_]+\b", span)
             if SETTING.match(token)}
    unknown = sorted(name for name in named if name not in known)
    assert not unknown, f"{name_of(doc)} names settings the code does not read: {unknown}"


@pytest.mark.parametrize("doc", [doc for doc in DOCS if doc.name != "settings.md"], ids=name_of)
def test_no_doc_but_the_settings_reference_names_a_renamed_variable(doc):
    """Old names stop start-up; a doc that still says `Q_WORKERS` sends its reader into that wall."""
    from idemops_demo.idemops_settings import DemoSettings
    from tools_app.conf import RENAMED as PLATFORM_RENAMED

    RENAMED = {**PLATFORM_RENAMED, **DemoSettings.renamed}

    named = {token for span in spans(text_of(doc)) for token in re.findall(r"\b[A-Z][A-Z0-9_]+\b", span)}
    assert sorted(named & set(RENAMED)) == [], f"{name_of(doc)} names old variables; docs/settings.md has the new ones"


UNITS = {"": 1, "s": 1, "kib": 1024, "mib": 1024 * 1024}


def _doc_number(cell: str) -> float | None:
    match = re.fullmatch(r"([\d.,]+)\s*(s|KiB|MiB)?", cell.strip())
    if not match:
        return None
    return float(match.group(1).replace(",", "")) * UNITS[(match.group(2) or "").lower()]


@pytest.mark.parametrize("doc", DOCS, ids=name_of)
def test_every_default_a_settings_table_states_is_the_default_in_the_code(doc):
    defaults = settings_read()
    wrong = []
    for name, cell in re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \| ([^|]+) \|", text_of(doc), re.MULTILINE):
        stated = _doc_number(cell)
        if name not in defaults or stated is None:
            continue
        actual = defaults[name]
        if actual is None or float(actual) != stated:
            wrong.append(f"{name}: doc says {cell.strip()}, code says {actual}")
    assert not wrong, f"{name_of(doc)}: {wrong}"


# --- endpoints ------------------------------------------------------------------------------------


ENDPOINT = re.compile(r"(?<![\w.])(/(?:api|admin|healthz|livez|readyz|mcp)[^\s`)\"',]*)")


def served_routes() -> list[str]:
    """Every URL pattern's full route, as text (prefixes like /api/v1/ are served if a route starts there)."""
    from django.urls import get_resolver

    def walk(patterns, prefix):
        for pattern in patterns:
            route = prefix + str(pattern.pattern).lstrip("^")
            if hasattr(pattern, "url_patterns"):
                yield from walk(pattern.url_patterns, route)
            else:
                yield "/" + route

    return list(walk(get_resolver().url_patterns, ""))


def _concrete(path: str) -> str:
    path = path.split("?")[0].rstrip(".")
    path = re.sub(r"\{[^}]*\}|<[^>]*>", "1", path)
    return path.replace("…", "").replace("...", "")


@pytest.mark.parametrize("doc", DOCS, ids=name_of)
def test_every_endpoint_a_doc_names_is_served(doc):
    asgi = (ROOT / "idemops" / "asgi.py").read_text()
    routes = served_routes()
    unserved = []
    for span in spans(text_of(doc)):
        for path in ENDPOINT.findall(span):
            concrete = _concrete(path)
            if concrete.startswith("/mcp"):
                if '"/mcp"' not in asgi and "'/mcp'" not in asgi:
                    unserved.append(path)
                continue
            try:
                resolve(concrete)
            except Resolver404:
                if not (concrete.endswith("/") and any(route.startswith(concrete) for route in routes)):
                    unserved.append(path)
    assert not unserved, f"{name_of(doc)} names endpoints that are not served: {unserved}"


def test_the_checks_above_read_something_from_every_doc():
    """A guard against a check that silently matches nothing."""
    for doc in DOCS:
        assert spans(text_of(doc)), name_of(doc)
    assert "IDEMOPS_TASK_LEASE_SECONDS" in settings_read()
    assert any(PATH.findall(text_of(doc)) for doc in DOCS)
    assert any(ENDPOINT.findall(" ".join(spans(text_of(doc)))) for doc in DOCS)


# --- and the other way round: what is built is documented -----------------------------------------


def test_the_api_doc_lists_every_endpoint_that_is_served():
    from tools_app.api.urls import router, v1_routes

    api_doc = text_of(ROOT / "docs" / "api.md")
    served = [f"/api/v1/{prefix}" for prefix, _, _ in router.registry]
    served += [f"/api/v1/{route.pattern}" for route in v1_routes if not str(route.pattern).startswith("^")]
    endpoint_table = "\n".join(line for line in api_doc.splitlines() if line.startswith("| `GET /api/v1/"))

    assert [path for path in served if f"`GET {path}" not in endpoint_table] == []
    assert "still to add" not in api_doc.lower()


def test_the_readme_lists_every_tool_and_the_docs_every_command():
    from tools_app.toolkit.registry import all_tools

    readme = text_of(ROOT / "README.md")
    everything = "\n".join(text_of(doc) for doc in DOCS)
    ours = [name for name, app in get_commands().items() if app == "tools_app"]

    assert [spec.name for spec in all_tools() if f"`{spec.name}`" not in readme] == []
    assert [command for command in ours if f"manage.py {command}" not in everything] == []


# --- the README's commands, run as written against a served stack ---------------------------------------


def readme_block(containing: str) -> list[str]:
    """The lines of the README's fenced shell block that contains `containing`."""
    blocks = re.findall(r"^```sh\n(.*?)^```", text_of(ROOT / "README.md"), re.MULTILINE | re.DOTALL)
    [block] = [block for block in blocks if containing in block]
    return [line for line in block.splitlines() if line.strip()]


def an_unknown_payment_of(tenant_slug: str, gateway_url: str) -> int:
    """A request_payment of the tenant that reached the gateway and paid, whose executor then died: UNKNOWN once
    its lease ran out. Not due for an hour, so the stack's reconciliation loop leaves it to the operator's
    "reconcile now" (which asks the gateway whatever the schedule says)."""
    payment = {"amount": "42.50", "currency": "EUR", "payee": "ACME Supplies", "reference": "INV-README"}
    spec = get_tool("request_payment")
    caller = Caller(tenant_id=Tenant.objects.get(slug=tenant_slug).pk, actor=f"agent:{tenant_slug}/billing-agent")
    operation, _ = write_operation(spec, caller, validate_arguments(spec, {**payment, "idempotency_key": "readme-1"}))
    record, claimed = engine.claim(operation)
    assert claimed
    paid = httpx2.post(f"{gateway_url}/payments", json=payment, headers={"Idempotency-Key": record.downstream_key})
    assert paid.status_code in (200, 201), paid.text
    with transaction.atomic():
        IdempotencyRecord.objects.filter(pk=record.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        assert record.pk in [expired.pk for expired in engine.expire_leases()]
        IdempotencyRecord.objects.filter(pk=record.pk).update(next_reconcile_at=timezone.now() + timedelta(hours=1))
    return record.pk


@pytest.mark.live
def test_the_readmes_operator_commands_and_the_client_demo_run_as_written_on_a_served_stack(
        transactional_db, tmp_path, gateway, sink):
    """`manage.py serve` as `make run` starts it (the demo on; the test's downstream systems in place of the
    demo's, as IDEMOPS_RUN_DEMO_DOWNSTREAMS=0 allows), then every line of the Operators block, then the client
    demo twice against the demo tenant: each line exits 0, and each demo run ends `duplicates 0`."""
    port = free_port()
    # As deployed: its person confirms the demo's small payment through the client (the suite's other servers
    # run without asking, tests/conftest.py).
    env = child_env(IDEMOPS_RUN_DEMO_DOWNSTREAMS="false", IDEMOPS_VAR_DIR=str(tmp_path), IDEMOPS_Q_WORKERS="1",
                    IDEMOPS_MCP_USER_CONFIRMATION="true",
                    IDEMOPS_EMBEDDED_DATABASE="false",  # the test database is not serve's to stop
                    **downstream_env(gateway, sink))
    serve = Service("serve-readme", [sys.executable, "manage.py", "serve", "--port", str(port)], env)
    try:
        serve.wait_http(f"http://127.0.0.1:{port}/readyz", timeout=180)
        operators = readme_block("manage.py create_tenant")
        assert len(operators) >= 12, operators
        reconciled = ""
        for line in operators:
            operator_reconciles = " ID " in line
            if operator_reconciles:
                line = line.replace(" ID ", f" {an_unknown_payment_of('acme', gateway.url)} ")
            done = subprocess.run(["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=300)
            assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
            reconciled = done.stdout if operator_reconciles else reconciled
        assert "succeeded" in reconciled  # the gateway had paid
        assert IdempotencyRecord.objects.get(tool="request_payment").status == RecordStatus.SUCCEEDED

        [demo_line] = [line for line in text_of(ROOT / "README.md").splitlines()
                       if "python -m idemops_client.demo --url" in line]
        words = re.search(r"`(python -m idemops_client\.demo --url \S+ --token )…`", demo_line)
        assert words, demo_line
        token = json.loads((tmp_path / "demo-credentials.json").read_text())["token"]
        command = words.group(1).replace("http://127.0.0.1:8000", f"http://127.0.0.1:{port}") + token
        for run in (1, 2):  # the second run on a tenant that already holds the first run's document
            demo = subprocess.run(["bash", "-c", command.replace("python", sys.executable, 1)], cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=600)
            last = demo.stdout.strip().splitlines()[-1] if demo.stdout.strip() else ""
            assert demo.returncode == 0 and last.endswith("duplicates 0"), f"run {run}:\n{demo.stdout}\n{demo.stderr}"
    finally:
        serve.stop(grace=30)


def test_every_package_opens_with_a_docstring_and_tools_app_draws_the_layers_pyproject_enforces():
    """A newcomer finds a concept by its package name and reads what it is in its first lines; the
    table of layers in tools_app/__init__.py is the one import-linter holds the code to."""
    import tomllib

    packages = sorted(path.parent for path in (ROOT / "tools_app").glob("*/__init__.py")
                      if path.parent.name != "migrations")
    without = [package.name for package in packages if not ast.get_docstring(ast.parse((package / "__init__.py")
                                                                                        .read_text()))]
    assert not without, f"packages without an opening docstring: {without}"

    contract = next(c for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
                    if c["type"] == "layers" and c["containers"] == ["tools_app"])
    enforced = [[name.strip() for name in layer.split("|")] for layer in contract["layers"]]
    docstring = ast.get_docstring(ast.parse((ROOT / "tools_app" / "__init__.py").read_text())) or ""
    drawn = [[name.strip() for name in re.split(r"\s{2,}", line.strip())[0].split("|")]
             for line in docstring.splitlines() if line.startswith("    ")]
    assert drawn == enforced, f"tools_app/__init__.py draws {drawn}; pyproject.toml enforces {enforced}"
    layered = {name for layer in enforced for name in layer}
    assert {package.name for package in packages} <= layered, "a package is in no layer"


def test_every_type_ignore_in_product_code_says_why():
    """An `ignore` silences the checker for a reason a reader needs: a comment on its line or the
    line above says it (pyproject.toml's [tool.mypy] asks for one)."""
    silent = []
    for folder in ("idemops", "tools_app", "idemops_demo", "idemops_client", "conformance"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            lines = path.read_text().splitlines()
            for number, line in enumerate(lines):
                if "type: ignore" not in line:
                    continue
                after = line.split("type: ignore", 1)[1]
                if "#" in after or lines[number - 1].strip().startswith("#"):
                    continue
                silent.append(f"{path.relative_to(ROOT)}:{number + 1}")
    assert not silent, f"a type: ignore without a reason: {silent}"
