"""URL allow-lists that cannot be escaped: webhook recipients and document URLs (tools_app.url_allowlist).

One check, at the tool call and again right before each request. Names are
resolved by the real resolver where this machine can answer (localhost); the
tests that need other DNS answers replace `url_allowlist.resolve`, the one
seam, and still make real requests.
"""

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ipaddress import ip_address

import pytest
from django.utils import timezone

from idemops_demo import documents
from tests.support.mcp_client import raw_call, raw_error_of
from tests.support.processes import free_port, manage
from tools_app import access, outbox
from tools_app.conf import conf, override_conf
from tools_app.core import url_allowlist
from tools_app.core.errors import InvalidInput, Transient
from tools_app.models import IdempotencyRecord, OutboxEvent, OutboxStatus
from tools_app.toolkit.calls import Caller, call_tool
from tools_app.toolkit.registry import get_tool

HOOKS = "http://127.0.0.1:8002/webhooks/"


@pytest.fixture
def hooks(settings):
    override_conf(settings,
                  webhook_allowed_prefixes=[HOOKS, "http://localhost:8002/webhooks/"],
                  outbound_private_hosts=[])
    return settings


@pytest.fixture
def dns(monkeypatch):
    """Play DNS: host -> addresses (or a gaierror); other names go to the real resolver."""
    answers = {}
    real = url_allowlist.resolve

    def resolve(host, port):
        if host not in answers:
            return real(host, port)
        if isinstance(answers[host], Exception):
            raise answers[host]
        return [ip_address(a) for a in answers[host]]

    monkeypatch.setattr(url_allowlist, "resolve", resolve)
    return answers


def check(url, prefixes=None):

    return url_allowlist.check(url, prefixes or conf().webhook_allowed_prefixes, field="recipient")


# --- each bypass ------------------------------------------------------------------------------------

BYPASSES = {
    "dot segments": "http://127.0.0.1:8002/webhooks/../../admin",
    "dot segments after a dot": "http://127.0.0.1:8002/webhooks/./../admin",
    "encoded dots": "http://127.0.0.1:8002/webhooks/%2e%2e/admin",
    "encoded dots, upper case": "http://127.0.0.1:8002/webhooks/%2E%2E/admin",
    "encoded slash": "http://127.0.0.1:8002/webhooks/..%2fadmin",
    "encoded backslash": "http://127.0.0.1:8002/webhooks/..%5cadmin",
    "double encoding": "http://127.0.0.1:8002/webhooks/%252e%252e/admin",
    "matrix dot segment": "http://127.0.0.1:8002/webhooks/..;/admin",
    "encoded NUL": "http://127.0.0.1:8002/webhooks/x%00.json",
    "backslash authority": "http://127.0.0.1:8002\\@evil.example/webhooks/",
    "userinfo": "http://127.0.0.1:8002@evil.example/webhooks/",
    "userinfo on the allowed host": "http://user:secret@127.0.0.1:8002/webhooks/x",
    "decimal IP": "http://2130706433:8002/webhooks/x",
    "octal IP": "http://0177.0.0.1:8002/webhooks/x",
    "hex IP": "http://0x7f.0.0.1:8002/webhooks/x",
    "short IP": "http://127.1:8002/webhooks/x",
    "IPv6-mapped IPv4": "http://[::ffff:127.0.0.1]:8002/webhooks/x",
    "IPv6-mapped IPv4, hex": "http://[::ffff:7f00:1]:8002/webhooks/x",
    "prefix without a segment break": "http://127.0.0.1:8002/webhooksevil/x",
    "host suffix": "http://127.0.0.1.evil.example:8002/webhooks/x",
    "other port": "http://127.0.0.1:8003/webhooks/x",
    "other scheme": "https://127.0.0.1:8002/webhooks/x",
    "file scheme": "file:///etc/passwd",
    "newline": "http://127.0.0.1:8002/webhooks/x\r\nX-Injected: 1",
    "name resolving to loopback": "http://localhost:8002/webhooks/x",
}


@pytest.mark.parametrize("url", BYPASSES.values(), ids=BYPASSES.keys())
def test_a_bypass_is_refused_as_invalid_input_naming_the_field(hooks, url):
    with pytest.raises(InvalidInput) as refused:
        check(url)

    assert refused.value.message.startswith("recipient: ")


@pytest.mark.parametrize(("url", "checked"), [
    ("http://127.0.0.1:8002/webhooks/ops", "http://127.0.0.1:8002/webhooks/ops"),
    ("HTTP://127.0.0.1:8002/webhooks/a/./b?x=1", "http://127.0.0.1:8002/webhooks/a/b?x=1"),
    ("http://127.0.0.1:8002/webhooks/%41", "http://127.0.0.1:8002/webhooks/%41"),
])
def test_an_allowed_url_is_checked_and_sent_as_normalised(hooks, url, checked):
    target = check(url)

    assert (str(target.url), target.address) == (checked, ip_address("127.0.0.1"))


def test_a_name_resolving_to_loopback_passes_only_when_listed_as_a_private_host(hooks):
    override_conf(hooks, outbound_private_hosts=["LOCALHOST"])

    assert check("http://localhost:8002/webhooks/x").address == ip_address("127.0.0.1")


@pytest.mark.parametrize("addresses", [
    ["10.0.0.7"], ["93.184.215.14", "192.168.1.1"], ["169.254.169.254"], ["100.64.0.1"], ["0.0.0.0"],
    ["::1"], ["fe80::1"], ["fc00::1"], ["::ffff:10.0.0.1"], ["2002:7f00:1::"], ["64:ff9b::7f00:1"], ["224.0.0.1"],
])
def test_a_name_resolving_to_any_non_public_address_is_refused(hooks, dns, addresses):
    dns["hooks.example"] = addresses

    with pytest.raises(InvalidInput, match="recipient: the host resolves to a private"):
        check("https://hooks.example/in", ["https://hooks.example/"])


def test_a_name_resolving_to_public_addresses_passes_and_is_pinned_to_the_first(hooks, dns):
    dns["hooks.example"] = ["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"]

    assert check("https://hooks.example/in", ["https://hooks.example/"]).address == ip_address("93.184.215.14")


def test_a_resolver_that_cannot_answer_now_is_transient_and_an_unknown_name_is_invalid(hooks, dns):
    dns["slow.example"] = socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    dns["gone.example"] = socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(Transient):
        check("https://slow.example/in", ["https://slow.example/"])
    with pytest.raises(InvalidInput, match="does not resolve"):
        check("https://gone.example/in", ["https://gone.example/"])


@pytest.mark.parametrize(("url", "allowed"), [
    ("https://docs.example.com/public", True),
    ("https://docs.example.com/public/a.pdf", True),
    ("https://docs.example.com/public-private/a.pdf", False),
    ("https://docs.example.com/publicx", False),
])
def test_a_prefix_without_a_trailing_slash_covers_whole_segments(settings, dns, url, allowed):
    dns["docs.example.com"] = ["93.184.215.14"]
    override_conf(settings, document_allowed_url_prefixes=["https://docs.example.com/public"])

    if allowed:
        assert str(documents.allowed_url(url).url) == url
    else:
        with pytest.raises(InvalidInput, match="^url: "):
            documents.allowed_url(url)


# --- at the tool call -----------------------------------------------------------------------------------


@pytest.mark.live
@pytest.mark.parametrize("path", ["webhooks/../../admin", "webhooks/%2e%2e/admin", "webhooks/..%2fadmin"])
def test_send_notification_refuses_a_bypass_before_claiming_the_key(web_server, token, _sink, path):
    answer = raw_call(web_server.mcp_url, token, "send_notification", {
        "channel": "webhook", "recipient": f"{_sink.url}/{path}", "subject": "s", "body": "b",
        "idempotency_key": "hook"})

    error = raw_error_of(answer)
    assert error["class"] == "invalid_input" and error["message"].startswith("recipient: ")
    assert IdempotencyRecord.objects.count() == OutboxEvent.objects.count() == 0


# --- at delivery and fetch time ------------------------------------------------------------------------


def stored_webhook(tenant, recipient):
    """An outbox event as stored: the relay must check it, whatever checked it before."""
    return OutboxEvent.objects.create(tenant=tenant, kind="notification.webhook", next_attempt_at=timezone.now(),
                                      created_at=timezone.now(),
                                      payload={"recipient": recipient, "subject": "s", "body": "b"})


@pytest.fixture
def acme(transactional_db):
    return access.create_tenant("acme")


@pytest.mark.live
def test_the_relay_never_posts_outside_the_allow_list(acme, downstreams, sink):
    # given: stored webhooks, one allowed and the rest escaping it in every way that reaches the sink
    legit = stored_webhook(acme, f"{sink.url}/webhooks/ok")
    escapes = [stored_webhook(acme, url) for url in [
        f"{sink.url}/webhooks/../../admin", f"{sink.url}/webhooks/%2e%2e/admin", f"{sink.url}/webhooks/..%2fadmin",
        f"{sink.url}/webhooks/%2e%2e", f"{sink.url}/other/", f"http://localhost:{sink.port}/webhooks/x",
        f"http://[::ffff:127.0.0.1]:{sink.port}/webhooks/x"]]

    # when: the relay runs, as its own process
    manage("relay_outbox", env=downstreams)

    # then: the sink got the allowed one, once, and nothing else at all
    assert sink.messages() == {str(legit.id): 1}
    assert sink.stray_requests() == []
    legit.refresh_from_db()
    assert legit.status == OutboxStatus.DELIVERED
    for event in escapes:
        event.refresh_from_db()
        assert (event.status, event.attempts) == (OutboxStatus.DEAD, 1), event.payload
        assert event.last_error.startswith("recipient: ")


@pytest.mark.live
def test_the_relay_connects_to_the_address_it_checked(acme, downstreams, sink, settings, dns):
    # given: a name only our DNS seam knows; the system resolver cannot answer it
    dns["hooks.test"] = ["127.0.0.1"]
    override_conf(settings,
                  outbound_private_hosts=["hooks.test"],
                  webhook_allowed_prefixes=[f"http://hooks.test:{sink.port}/webhooks/"])
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo("hooks.test", sink.port)
    event = stored_webhook(acme, f"http://hooks.test:{sink.port}/webhooks/pinned")

    # when
    report = outbox.relay_pending()

    # then: delivered, so the request went to the checked address and not to a second lookup
    assert report["delivered"] == 1 and sink.messages() == {str(event.id): 1}


@pytest.mark.live
def test_a_name_that_rebinds_to_a_private_address_after_the_call_is_not_delivered(acme, downstreams, sink,
                                                                                   settings, dns):
    override_conf(settings, webhook_allowed_prefixes=["http://rebind.test/webhooks/"])
    dns["rebind.test"] = ["93.184.215.14"]
    caller = Caller(tenant_id=acme.pk, actor="agent:acme/test")
    called = call_tool(get_tool("send_notification"), caller, {
        "channel": "webhook", "recipient": "http://rebind.test/webhooks/x", "subject": "s", "body": "b",
        "idempotency_key": "rebind"})
    assert called.error is None

    dns["rebind.test"] = ["127.0.0.1"]
    report = outbox.relay_pending()

    event = OutboxEvent.objects.get()
    assert report["dead"] == 1 and event.status == OutboxStatus.DEAD
    assert "private" in event.last_error and sink.stray_requests() == []


class Redirector:
    """Answers every request with a 307 (which keeps a POST a POST) to `location`."""

    def __init__(self, location: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.hits = 0
        redirector = self

        class Handler(BaseHTTPRequestHandler):
            def _redirect(self):
                redirector.hits += 1
                self.send_response(307)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _redirect

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def redirector(_sink):
    server = Redirector(f"{_sink.url}/admin")
    yield server
    server.close()


@pytest.mark.live
def test_a_webhook_that_redirects_is_not_followed(acme, downstreams, sink, settings, redirector):
    override_conf(settings, webhook_allowed_prefixes=[f"{redirector.url}/webhooks/"])
    event = stored_webhook(acme, f"{redirector.url}/webhooks/x")

    report = outbox.relay_pending()

    event.refresh_from_db()
    assert (report["retried"], redirector.hits, event.last_error) == (1, 1, "HTTP 307")
    assert sink.stray_requests() == [] and sink.messages() == {}


@pytest.mark.live
def test_a_document_url_that_redirects_is_refused_and_not_followed(settings, sink, redirector):
    override_conf(settings, document_allowed_url_prefixes=[f"{redirector.url}/docs/"])

    with pytest.raises(InvalidInput, match="redirect"):
        documents.fetch_url(f"{redirector.url}/docs/a.txt")

    assert redirector.hits == 1 and sink.stray_requests() == []


def test_a_document_url_is_checked_again_when_fetched(settings):
    override_conf(settings, document_allowed_url_prefixes=["http://127.0.0.1:1/docs/"])

    with pytest.raises(InvalidInput, match="^url: "):
        documents.fetch_url("http://127.0.0.1:1/docs/../secret")


@pytest.fixture
def tls_docs(tmp_path, monkeypatch):
    """An HTTPS document server for the name docs.test, with a self-signed certificate this process trusts;
    it notes the TLS server name and the Host header of each request."""
    import datetime
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "docs.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("docs.test")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "cert.pem"))

    seen = {"sni": [], "host": []}
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    context.sni_callback = lambda sock, server_name, ctx: seen["sni"].append(server_name)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen["host"].append(self.headers["Host"])
            body = b"Harbor cranes lift containers."
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    port = free_port()
    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield port, seen
    httpd.shutdown()
    httpd.server_close()


def test_an_https_document_is_fetched_from_the_checked_address_with_its_name_verified(settings, dns, tls_docs):
    port, seen = tls_docs
    dns["docs.test"] = ["127.0.0.1"]
    override_conf(settings,
                  outbound_private_hosts=["docs.test"],
                  document_allowed_url_prefixes=[f"https://docs.test:{port}/"])

    body = documents.fetch_url(f"https://docs.test:{port}/a.txt")

    # The connection went to 127.0.0.1 (nothing else resolves docs.test), yet TLS and HTTP saw the name.
    assert body == b"Harbor cranes lift containers."
    assert (seen["sni"], seen["host"]) == (["docs.test"], [f"docs.test:{port}"])
