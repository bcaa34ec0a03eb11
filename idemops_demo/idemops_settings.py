"""The demo's own settings: its payment gateway, its documents and search, its ticket batch.

Registered through the public settings API (`idemops.conf.register_settings`): start-up reads these
IDEMOPS_* variables with the platform's, and the demo reads them with `DemoSettings.current()`. The
platform's own settings (`idemops.conf.conf()`) know nothing of them. Imports pydantic and
`idemops.conf` only: it is read while Django's settings are being built.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import SecretStr

from idemops.conf import AppSettings, HttpUrl, Seconds, TextList, UrlList, register_settings, setting


@register_settings
class DemoSettings(AppSettings):
    """Every setting of the demo, each from IDEMOPS_<NAME> like the platform's."""

    title: ClassVar[str] = "The demo app (idemops_demo, with IDEMOPS_DEMO on)"
    renamed: ClassVar[dict[str, str]] = {
        "PAYMENT_GATEWAY_URL": "IDEMOPS_PAYMENT_GATEWAY_URL",
        "PAYMENT_GATEWAY_TIMEOUT_SECONDS": "IDEMOPS_PAYMENT_GATEWAY_TIMEOUT_SECONDS",
    }

    # --- its downstream systems ---
    run_demo_downstreams: bool = setting(
        True, "`make run` starts the demo payment gateway and notification sink (with IDEMOPS_DEMO on).")
    payment_gateway_url: HttpUrl = setting(
        "http://127.0.0.1:8001", "Base URL of the payment gateway request_payment calls.")
    payment_gateway_timeout_seconds: Seconds = setting(
        5, "Timeout of one payment gateway request; a timeout is an unknown outcome.")
    payment_gateway_callback_secret: SecretStr = setting(
        SecretStr(""), "Shared secret of the payment gateway's signed callbacks to /callbacks/payment-gateway, "
        "which settle an unknown payment at once (empty: callbacks are refused).", shown="empty")

    # --- documents and search ---
    document_allowed_dirs: TextList = setting(
        [], "Absolute directories whose files ingest_document may read (comma-separated; empty: none).")
    document_allowed_url_prefixes: UrlList = setting(
        [], "URL prefixes ingest_document may fetch from (comma-separated; empty: none).")
    document_max_bytes: int = setting(20 * 1024 * 1024, "Largest document.", gt=0)
    document_fetch_timeout_seconds: Seconds = setting(30, "Timeout of one document fetch.")
    document_chunk_chars: int = setting(1200, "Size of a document chunk.", ge=1)
    document_embed_batch: int = setting(
        64, "Chunks embedded (and written) per batch of the embed step: a crash loses at most one batch.", ge=1,
        le=10_000)
    search_rrf_k: int = setting(
        60, "The k of reciprocal-rank fusion in hybrid search: score = sum of 1/(k + rank) over the keyword and "
        "the semantic ranking.", ge=1)
    search_candidates: int = setting(
        50, "Hits each ranking (keyword, semantic) contributes to hybrid search before fusion.", ge=1, le=1000)
    retention_documents_hours: float = setting(
        24 * 365, "How long an ingested document (and its chunks and vectors) is kept, from its creation: the "
        "default of the demo's `documents` retention kind.", gt=0)

    # --- the ticket batch ---
    ticket_batch_chunk: int = setting(
        250, "Tickets process_ticket_batch changes per transaction (a crash resumes at the chunk it was in).",
        ge=1, le=10_000)
