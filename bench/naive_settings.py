"""The benchmark's comparison server: the project's settings with one extra, non-streaming route."""

from idemops.settings import *  # noqa: F403

ROOT_URLCONF = "bench.naive_urls"
