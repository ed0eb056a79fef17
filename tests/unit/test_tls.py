"""HTTPS from certificate_file / private_key_file (and client certificates from option.ssl_ca_certs): the
startup checks name the key, and the health responder, the child process that answers /ping while the
model loads, answers over the same TLS as the server (real certificates, a real child, real clients)."""

from __future__ import annotations

import json
import socket
import ssl

import pytest
import requests
from tlscerts import Authority

from lmi_trt.config import ConfigError, StartupError, load_config
from lmi_trt.serving.health_responder import HealthResponder
from lmi_trt.serving.tls import check_tls, tls_files


@pytest.fixture(scope="module")
def ca(tmp_path_factory) -> Authority:
    return Authority(tmp_path_factory.mktemp("tls"))


def config(**overrides: str):
    return load_config(overrides={"option.rolling_batch": "synthetic", **overrides})


def test_certificate_and_key_come_together_under_djl_and_vllm_names(ca):
    server = ca.issue("server-a")
    djl = config(certificate_file=str(server.cert), private_key_file=str(server.key))
    vllm = config(**{"option.ssl_certfile": str(server.cert), "option.ssl_keyfile": str(server.key)})
    assert tls_files(djl) == tls_files(vllm) and tls_files(djl).client_certs == "none"
    check_tls(djl)
    with pytest.raises(ConfigError, match="certificate_file=.* needs private_key_file"):
        config(certificate_file=str(server.cert))
    with pytest.raises(ConfigError, match="option.ssl_keyfile .*needs certificate_file"):
        config(**{"option.ssl_keyfile": str(server.key)})
    with pytest.raises(ConfigError, match="ssl_ca_certs verifies client certificates, which needs HTTPS"):
        config(**{"option.ssl_ca_certs": str(ca.issued.cert)})


def test_client_certificate_settings_that_would_do_nothing_are_refused(ca):
    server = ca.issue("server-b")
    files = {"certificate_file": str(server.cert), "private_key_file": str(server.key)}
    assert tls_files(config(**files, **{"option.ssl_ca_certs": str(ca.issued.cert)})).client_certs == "required"
    optional = config(**files, **{"option.ssl_ca_certs": str(ca.issued.cert), "option.ssl_cert_reqs": "1"})
    assert tls_files(optional).client_certs == "optional"  # vLLM's ssl.CERT_OPTIONAL
    with pytest.raises(ConfigError, match="ssl_cert_reqs=none would leave option.ssl_ca_certs unused"):
        config(**files, **{"option.ssl_ca_certs": str(ca.issued.cert), "option.ssl_cert_reqs": "0"})
    with pytest.raises(ConfigError, match="ssl_cert_reqs=required needs option.ssl_ca_certs"):
        config(**files, **{"option.ssl_cert_reqs": "required"})


def test_files_that_do_not_load_stop_startup_naming_the_key(ca, tmp_path):
    server, other = ca.issue("server-c"), ca.issue("server-d")
    with pytest.raises(StartupError) as missing:
        check_tls(config(certificate_file=str(tmp_path / "nope.pem"), private_key_file=str(server.key)))
    assert missing.value.key == "certificate_file" and "no such file" in str(missing.value)
    with pytest.raises(StartupError, match="do not load") as mismatched:
        check_tls(config(certificate_file=str(server.cert), private_key_file=str(other.key)))
    assert mismatched.value.key == "certificate_file"
    locked = ca.issue("server-e", password=b"secret")
    with pytest.raises(StartupError, match="encrypted"):  # never a password prompt on the terminal
        check_tls(config(certificate_file=str(locked.cert), private_key_file=str(locked.key)))


def test_djl_keystore_keys_are_refused_with_what_to_set_instead():
    with pytest.raises(
        ConfigError, match="keystore='ks.p12' is not supported: .*private_key_file and certificate_file"
    ):
        config(keystore="ks.p12")
    with pytest.raises(ConfigError) as err:
        config(keystore_pass="changeit-please")
    assert "changeit-please" not in str(err.value)  # a secret, masked


def _listener() -> socket.socket:
    return socket.create_server(("127.0.0.1", 0), backlog=16)


def test_the_health_responder_answers_pending_over_the_servers_tls(ca, tmp_path):
    server = ca.issue("server-f")
    files = tls_files(config(certificate_file=str(server.cert), private_key_file=str(server.key)))
    sock = _listener()
    port = sock.getsockname()[1]
    responder = HealthResponder(sock, "tiny", files)
    try:
        r = requests.get(f"https://127.0.0.1:{port}/ping", verify=str(ca.issued.cert), timeout=10)
        assert r.status_code == 503 and r.json() == {"tiny": {"status": "PENDING"}}
        stranger = Authority(tmp_path, name="another CA")  # a client that trusts another CA
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(f"https://127.0.0.1:{port}/ping", verify=str(stranger.issued.cert), timeout=10)
    finally:
        responder.stop()
        sock.close()


def test_the_health_responder_asks_for_client_certificates_when_the_server_does(ca):
    server, client = ca.issue("server-g"), ca.issue("client-g", client=True)
    files = tls_files(
        config(
            certificate_file=str(server.cert),
            private_key_file=str(server.key),
            **{"option.ssl_ca_certs": str(ca.issued.cert)},
        )
    )
    sock = _listener()
    url = f"https://127.0.0.1:{sock.getsockname()[1]}/ping"
    responder = HealthResponder(sock, "tiny", files)
    try:
        r = requests.get(url, verify=str(ca.issued.cert), cert=(str(client.cert), str(client.key)), timeout=10)
        assert r.status_code == 503 and json.loads(r.text) == {"tiny": {"status": "PENDING"}}
        with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
            requests.get(url, verify=str(ca.issued.cert), timeout=10)  # no client certificate
    finally:
        responder.stop()
        sock.close()


def test_server_context_is_tls12_or_newer(ca):
    server = ca.issue("server-h")
    context = tls_files(config(certificate_file=str(server.cert), private_key_file=str(server.key))).context()
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2 and context.verify_mode == ssl.CERT_NONE
