"""Client ID Metadata Documents are fetched through the platform's outbound URL allow-list and SSRF guard
(tools_app.access.oauth.AllowListedMetadataFetcher): only under the configured prefixes, never from a
private address, never larger than the limit, over real HTTP from a local server.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ipaddress import ip_address

import pytest
from oauth2_provider.cimd import CIMDError

from tools_app.access.oauth import AllowListedMetadataFetcher
from tools_app.conf import override_conf
from tools_app.core import url_allowlist

DOCUMENT = {"client_id": "set per request", "client_name": "a host", "redirect_uris": ["http://127.0.0.1:9/cb"]}


@pytest.fixture
def documents():
    """A local server: /client.json is a small document, /big.json one over 16 KB; it counts requests."""
    served: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            served.append(self.path)
            body = json.dumps({**DOCUMENT, "padding": "x" * (20_000 if self.path == "/big.json" else 0)}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Cache-Control", "max-age=600")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", served
    server.shutdown()


def test_a_document_under_an_allowed_prefix_is_fetched_with_its_max_age(settings, documents):
    base, served = documents
    override_conf(settings, oauth_client_metadata_allowed_prefixes=[f"{base}/"])

    document, max_age = AllowListedMetadataFetcher().fetch(f"{base}/client.json")

    assert document["client_name"] == "a host" and max_age == 600 and served == ["/client.json"]


def test_a_document_larger_than_the_limit_is_refused(settings, documents):
    base, _ = documents
    override_conf(settings, oauth_client_metadata_allowed_prefixes=[f"{base}/"])

    with pytest.raises(CIMDError, match="larger than"):
        AllowListedMetadataFetcher().fetch(f"{base}/big.json")


def test_a_document_outside_the_allow_list_is_not_even_requested(settings, documents):
    base, served = documents
    override_conf(settings, oauth_client_metadata_allowed_prefixes=[])

    with pytest.raises(CIMDError, match="allow-list"):
        AllowListedMetadataFetcher().fetch(f"{base}/client.json")

    assert served == []


def test_a_host_that_resolves_to_a_private_address_is_refused(settings, monkeypatch):
    override_conf(settings, oauth_client_metadata_allowed_prefixes=["https://clients.example/"])
    monkeypatch.setattr(url_allowlist, "resolve", lambda host, port: [ip_address("10.0.0.5")])

    with pytest.raises(CIMDError, match="private"):
        AllowListedMetadataFetcher().fetch("https://clients.example/host.json")
