"""A person's browser for the proxy's OAuth sign-in, launched by the proxy as $BROWSER with the authorization URL.

The person is already logged in to the console (with their authenticator code): the test hands over that
session's cookies. Like a person at the consent page it opens the URL, picks the tenant, presses Connect,
and follows the redirect to the proxy's listener on 127.0.0.1. Each URL it is sent to is appended to
$CONSENT_LOG, so a test can count the sign-ins that needed a person.
"""

from __future__ import annotations

import json
import os
import re
import sys

import httpx2


def main(url: str) -> None:
    with open(os.environ["CONSENT_LOG"], "a") as log:
        log.write(url + "\n")
    with httpx2.Client(cookies=json.loads(os.environ["CONSENT_COOKIES"]), timeout=30) as http:
        page = http.get(url)
        page.raise_for_status()
        fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page.text))
        answer = http.post(url.split("?")[0], data={**fields, "tenant": os.environ["CONSENT_TENANT"],
                                                     "granted": ["read", "write"], "allow": "Connect"})
        assert answer.status_code == 302, answer.text[:500]
        http.get(answer.headers["location"])  # the redirect, to the proxy's callback


if __name__ == "__main__":
    main(sys.argv[1])
