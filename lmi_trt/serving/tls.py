"""HTTPS from the configuration: ``certificate_file`` and ``private_key_file`` (DJL's keys; vLLM's
``--ssl-certfile`` / ``--ssl-keyfile`` are their aliases), and client certificates verified against
``option.ssl_ca_certs`` (vLLM's ``--ssl-ca-certs`` / ``--ssl-cert-reqs``). The context itself is built by
``health_responder.TlsFiles``, which the health responder child shares without importing lmi_trt.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from lmi_trt.config import LmiConfig, StartupError, key_of
from lmi_trt.serving.health_responder import TlsFiles


def tls_files(config: LmiConfig) -> TlsFiles | None:
    """The TLS settings (None: plain HTTP). Client certificates are required when CA certificates are
    given and option.ssl_cert_reqs is unset (config refuses CA certificates that nothing would use)."""
    if config.certificate_file is None or config.private_key_file is None:
        return None
    cafile = config.ssl_ca_certs
    return TlsFiles(
        str(config.certificate_file),
        str(config.private_key_file),
        str(cafile) if cafile is not None else None,
        config.ssl_cert_reqs or ("required" if cafile is not None else "none"),
    )


def check_tls(config: LmiConfig) -> None:
    """At startup: the TLS files exist and load, or a StartupError naming the key."""
    files = tls_files(config)
    if files is None:
        return
    for attr, path in (
        ("certificate_file", files.certfile),
        ("private_key_file", files.keyfile),
        ("ssl_ca_certs", files.cafile),
    ):
        if path is not None and not Path(path).is_file():
            raise StartupError(key_of(attr), path, "there is no such file", "give the path of a PEM file")
    try:
        files.context()
    except (ssl.SSLError, OSError, ValueError) as e:
        keys = "certificate_file, private_key_file" + (" and option.ssl_ca_certs" if files.cafile else "")
        raise StartupError(
            key_of("certificate_file"),
            files.certfile,
            f"the TLS files ({keys}) do not load: {e}",
            "give a PEM certificate chain, its unencrypted PEM private key"
            + (" and PEM CA certificates" if files.cafile else ""),
        ) from None
