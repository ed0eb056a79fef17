"""The request a log line is about, in the line itself.

``REQUEST_ID`` is a context variable: the HTTP layer sets it while it handles one request
(``lmi_trt.serving.access``), so everything logged on that request's behalf, in its task or in tasks
started from it, is tagged without the id being passed along. ``install_request_tag`` adds a filter
to the root logger's handlers that puts `` [ID]`` (or nothing, outside a request) into each record as
``request_tag``, which ``log_format`` prints after the logger name. A filter on the handler (not a
record factory) also tags records a library built itself; it runs in the thread that logs, where the
variable has the request's value.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

REQUEST_ID: ContextVar[str | None] = ContextVar("lmi_request_id", default=None)


def log_format(prefix: str = "") -> str:
    """The server's log line: time, ``prefix`` (e.g. ``rank1 ``), level, logger, request tag, message."""
    return f"%(asctime)s {prefix}%(levelname)s %(name)s%(request_tag)s: %(message)s"


class _RequestTag(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        request_id = REQUEST_ID.get()
        record.request_tag = f" [{request_id}]" if request_id else ""
        return True


def install_request_tag() -> None:
    """Tag every record the root logger's handlers write (idempotent; call it after adding handlers)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _RequestTag) for f in handler.filters):
            handler.addFilter(_RequestTag())
