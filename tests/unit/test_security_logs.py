"""Secret values never reach a log line, whoever logs them (our code, a library, a traceback)."""

from __future__ import annotations

import io
import logging

import pytest

from lmi_trt import log_redaction
from lmi_trt.log_redaction import install_log_redaction, secret_values


@pytest.fixture
def root_log(monkeypatch):
    """The root logger writing to a buffer, with redaction state and levels restored afterwards."""
    root = logging.getLogger()
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    monkeypatch.setattr(root, "handlers", [handler])
    monkeypatch.setattr(log_redaction, "_REDACTED", set())
    botocore = logging.getLogger("botocore")
    level = botocore.level
    old_root_level = root.level
    root.setLevel(logging.DEBUG)
    yield buffer
    botocore.setLevel(level)
    root.setLevel(old_root_level)


ENV = {
    "HF_TOKEN": "hf_abcdefghijklmnop",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCY",
    "AWS_SESSION_TOKEN": "IQoJb3JpZ2luX2VjEJr//////////wEaCXVz",
    "OPTION_MAX_NUM_TOKENS": "123456789",
    "MY_API_KEY": "short",
    "HF_HUB_OFFLINE": "1",
}


def test_secret_values_are_the_secret_looking_variables():
    assert sorted(secret_values(ENV)) == sorted(
        [ENV["HF_TOKEN"], ENV["AWS_SECRET_ACCESS_KEY"], ENV["AWS_SESSION_TOKEN"]]
    )


def test_messages_arguments_and_tracebacks_are_masked(root_log):
    install_log_redaction(["option-hf-token-from-properties"], env=ENV)
    log = logging.getLogger("somewhere")
    log.info("token=%s", ENV["HF_TOKEN"])
    log.warning(f"url https://x/?sig={ENV['AWS_SECRET_ACCESS_KEY']}")
    log.info("from properties: %r", {"option.hf_token": "option-hf-token-from-properties"})
    try:
        raise RuntimeError(f"failed with {ENV['AWS_SESSION_TOKEN']}")
    except RuntimeError:
        log.exception("boom")
    install_log_redaction(env=ENV)  # idempotent: no double wrapping
    log.info("again %s", ENV["HF_TOKEN"])
    text = root_log.getvalue()
    for secret in (*secret_values(ENV), "option-hf-token-from-properties"):
        assert secret not in text
    assert text.count("****") == 5
    assert "RuntimeError: failed with ****" in text


def test_botocore_request_dumps_stay_out_even_at_debug(root_log):
    install_log_redaction(env={})
    logging.getLogger("botocore.endpoint").debug("Sending http request: headers={'x-amz-security-token': b'ROLE'}")
    logging.getLogger("lmi_trt.x").debug("our own debug line")
    text = root_log.getvalue()
    assert "ROLE" not in text and "our own debug line" in text


def test_client_values_are_logged_on_one_line():
    """A decoded %0A, a carriage return, an ANSI escape, a Unicode line separator: none starts a forged line."""
    from lmi_trt.log_redaction import loggable

    text = loggable("/p\n2099-01-01 ERROR forged\r\x1b[2K\u2028x\\n")
    assert text == "/p\\n2099-01-01 ERROR forged\\r\\x1b[2K\\u2028x\\\\n"
    assert loggable("é" * 300, limit=10) == "é" * 10 + "..."  # printable text is kept, and bounded
