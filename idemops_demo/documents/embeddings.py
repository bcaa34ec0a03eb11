"""Text embeddings from a model that ships inside its wheel: nothing is downloaded at run time.

The model is WordLlama's `l2_supercat` at 256 dimensions (PyPI `wordllama`):
token embeddings distilled from large language models, mean-pooled into one
vector per text. Its weights (16 MB) and tokenizer are files of the wheel, so
a worker embeds with no network and no hub cache, and the same text always
gets the same vector on every machine. It is loaded once per process, on
first use (about half a second), and embeds on the CPU with numpy.

Why this one: the other small embedders on PyPI (fastembed, model2vec,
sentence-transformers) fetch their weights from a model hub at run time, and
the packages that carry a transformer inside (all-MiniLM in a wheel) need
torch, hundreds of megabytes more, for a model this use does not need.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

MODEL_NAME = "wordllama/l2_supercat-256"
DIMENSIONS = 256

_lock = threading.Lock()
# A wordllama.WordLlama once loaded (the package ships no types).
_model: Any = None


def _load() -> Any:
    global _model
    with _lock:
        if _model is None:
            # Imported on first use, not for a cycle: it costs half a second (numpy, tokenizers) and the
            # model 16 MB, which the many processes that never embed (commands, the admin) are spared.
            import wordllama

            # The wheel keeps weights/ and tokenizers/ next to the package; WordLlama looks for
            # them in a cache directory laid out the same way, so the package directory is one.
            _model = wordllama.WordLlama.load(cache_dir=Path(wordllama.__file__).parent, disable_download=True,
                                              dim=DIMENSIONS)
    return _model


def embed(texts: list[str]) -> list[list[float]]:
    """One unit-length vector per text (cosine similarity = dot product)."""
    if not texts:
        return []
    vectors: list[list[float]] = _load().embed(texts, norm=True).astype("float32").tolist()
    return vectors


def embed_one(text: str) -> list[float]:
    return embed([text])[0]
