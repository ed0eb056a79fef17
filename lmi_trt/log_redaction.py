"""Secrets out of every log line (libraries log too: botocore's DEBUG request dumps carry
x-amz-security-token, an exception may quote a URL with a token in it), and lines a client cannot forge
(``loggable``).

Process-wide: ``install_log_redaction`` wraps the root logger's handlers. The environment it takes
secrets from is passed in (``lmi_trt.config.process_environment``); this module reads none.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping

MASK = "****"

_REDACTED: set[str] = set()
_MIN_SECRET_LEN = 8  # shorter values ("1", "true") would mask ordinary text


class _RedactingFormatter(logging.Formatter):
    """Wraps a handler's formatter; masks every known secret value in the finished line."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        text = self.inner.format(record)
        for secret in sorted(_REDACTED, key=len, reverse=True):
            if secret in text:
                text = text.replace(secret, MASK)
        return text


def secret_values(env: Mapping[str, str]) -> list[str]:
    """Values of secret-looking environment variables (HF_TOKEN, AWS_SECRET_ACCESS_KEY,
    AWS_SESSION_TOKEN, OPTION_HF_TOKEN, ...), for log redaction."""
    return [v for k, v in env.items() if is_secret_name(k) and len(v) >= _MIN_SECRET_LEN]


def install_log_redaction(extra: Iterable[str] = (), *, env: Mapping[str, str]) -> None:
    """Mask secrets (from ``env``, ``lmi_trt.config.process_environment()`` in the server, plus
    ``extra`` such as ``option.hf_token`` from a
    properties file) in everything the root logger's handlers write. Idempotent; call it again
    to add secrets. Also keeps botocore's per-request DEBUG dumps (headers with session tokens of
    role credentials that no variable names) out of the log."""
    _REDACTED.update(secret_values(env))
    _REDACTED.update(v for v in extra if v and len(v) >= _MIN_SECRET_LEN)
    for handler in logging.getLogger().handlers:
        if not isinstance(handler.formatter, _RedactingFormatter):
            handler.setFormatter(_RedactingFormatter(handler.formatter or logging.Formatter()))
    botocore = logging.getLogger("botocore")
    if botocore.getEffectiveLevel() < logging.INFO:
        botocore.setLevel(logging.INFO)


def is_secret_name(name: str) -> bool:
    """HF_TOKEN, AWS_SECRET_ACCESS_KEY, API_KEY, DB_PASSWORD... but not MAX_NUM_TOKENS or TOKENIZER_ID:
    TOKEN and KEY count only at the end of a word, SECRET and PASSWORD anywhere."""
    words = re.split(r"[^A-Z0-9]+", name.upper())
    return any(w.endswith(("TOKEN", "KEY")) or "SECRET" in w or "PASSWORD" in w or "PASSWD" in w for w in words)


def loggable(value: object, limit: int = 200) -> str:
    """A client's value (a URL path, a name, an error message quoting a request) as a log line may hold it:
    control and other unprintable characters escaped as Python writes them in a repr (a decoded ``%0A`` in a
    path would otherwise start a forged line), at most ``limit`` characters."""
    text = repr(str(value))[1:-1]
    return text if len(text) <= limit else text[:limit] + "..."
