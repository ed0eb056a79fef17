"""What an operator sets up around the model, against `lmi-trt serve` as a real process and real clients:
an API key (the openai client, huggingface_hub's InferenceClient, plain HTTP), HTTPS from a certificate
and key (clients verify it; client certificates when asked for), and X-Request-Id in responses and in
the log lines of its request. (The progress watchdog's process test is in test_reliability_lifecycle.py.)
"""

from __future__ import annotations

import socket
import time

import pytest
import requests
from cliserver import serve
from tinymodels import tiny_model
from tlscerts import Authority

pytestmark = pytest.mark.slow

KEYS = ("sk-first-0123456789", "sk-second-9876543210")
SYNTHETIC = ["--engine", "synthetic", "--model-name", "tiny", "-o", "option.max_output_len=64"]
MESSAGES = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    """Plain HTTP with two API keys, one from vLLM's environment variable and one from the file."""
    folder = tmp_path_factory.mktemp("keyed")
    (folder / "serving.properties").write_text(f"option.api_key={KEYS[0]},{KEYS[1]}\nbody_read_timeout=1\n")
    args = ["--model-id", str(tiny_model("llama")), "--properties", str(folder / "serving.properties"), *SYNTHETIC]
    with serve(args, folder, env={"VLLM_API_KEY": "sk-shadowed-by-the-file-key"}) as server:
        yield server


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# --- API key ---
def test_openai_client_with_a_key_a_wrong_key_and_none(keyed):
    import openai

    for key in KEYS:  # either key works: rotation
        client = openai.OpenAI(base_url=keyed.url + "/v1", api_key=key, max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=MESSAGES, max_tokens=4, extra_headers={"X-Request-Id": f"oai-{key[3:8]}"}
        )
        assert raw.headers["X-Request-Id"] == f"oai-{key[3:8]}"
        assert raw.parse().id == f"chatcmpl-oai-{key[3:8]}" and raw.parse().choices[0].message.content
    wrong = openai.OpenAI(base_url=keyed.url + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        wrong.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4)
    assert err.value.status_code == 401
    with pytest.raises(openai.AuthenticationError):  # the key of the environment lost to the file's
        openai.OpenAI(base_url=keyed.url + "/v1", api_key="sk-shadowed-by-the-file-key", max_retries=0).models.list()
    r = requests.post(keyed.url + "/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES}, timeout=30)
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"


def test_huggingface_inference_client_sends_its_token(keyed, hf_online):
    from huggingface_hub import InferenceClient
    from huggingface_hub.errors import HfHubHTTPError

    text = InferenceClient(model=keyed.url, token=KEYS[1]).text_generation("Hello there", max_new_tokens=4)
    assert text
    reply = InferenceClient(base_url=keyed.url, api_key=KEYS[0]).chat_completion(MESSAGES, max_tokens=4)
    assert reply.choices[0].message.content
    with pytest.raises(HfHubHTTPError) as err:
        InferenceClient(model=keyed.url, token="hf_not_the_key").text_generation("Hello there", max_new_tokens=4)
    assert err.value.response.status_code == 401


def test_probes_and_metrics_need_no_key(keyed):
    for path in ("/ping", "/health", "/v2/health/ready", "/metrics"):
        assert keyed.get(path).status_code == 200, path
    for path in ("/v1/models", "/v1/capabilities", "/info"):
        assert keyed.get(path).status_code == 401, path
        assert keyed.get(path, headers=bearer(KEYS[0])).status_code == 200, path


def test_the_keys_never_reach_the_log(keyed):
    keyed.get("/v1/models", headers=bearer("sk-wrong-but-logged?"))
    log = keyed.log()
    assert "option.api_key = ****" in log
    assert not any(k in log for k in (*KEYS, "sk-shadowed-by-the-file-key")), log[-3000:]


# --- X-Request-Id in the log ---
def test_log_lines_about_a_request_name_its_id(keyed):
    """A body slower than body_read_timeout=1 is refused with a warning logged while the request is
    handled (the first of its kind here: such warnings are rate-limited); that line names the request."""
    with socket.create_connection(("127.0.0.1", keyed.port), timeout=30) as sock:
        sock.sendall(
            b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 40\r\n"
            + f"Authorization: Bearer {KEYS[0]}\r\nX-Request-Id: slow-body-7\r\n\r\n".encode()
            + b'{"inputs": '
        )
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 408") and b"X-Request-Id: slow-body-7" in answer
    deadline = time.monotonic() + 30
    while "[slow-body-7]" not in keyed.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    lines = [line for line in keyed.log().splitlines() if "slow-body-7" in line]
    assert lines and all("[slow-body-7]" in line for line in lines), keyed.log()[-3000:]
    assert any("lmi_trt.serving.http [slow-body-7]: a request body took longer" in line for line in lines), lines


# --- HTTPS ---
@pytest.fixture(scope="module")
def ca(tmp_path_factory) -> Authority:
    return Authority(tmp_path_factory.mktemp("ca"))


def test_https_with_a_certificate_clients_verify(ca, tmp_path):
    server_cert = ca.issue("server")
    args = [
        "--model-id",
        str(tiny_model("llama")),
        *SYNTHETIC,
        "-o",
        f"option.ssl_certfile={server_cert.cert}",  # vLLM's spelling; DJL's certificate_file is the same key
        "-o",
        f"private_key_file={server_cert.key}",
    ]
    with serve(args, tmp_path, ca=ca.issued.cert) as server:
        import openai

        client = openai.OpenAI(
            base_url=server.url + "/v1",
            api_key="unused",
            max_retries=0,
            http_client=openai.DefaultHttpxClient(verify=str(ca.issued.cert)),
        )
        reply = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4)
        assert reply.choices[0].message.content
        stream = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        with pytest.raises(requests.exceptions.SSLError):  # the system's CAs do not know it: it is TLS, ours
            requests.get(server.url + "/ping", timeout=30)
        with pytest.raises(requests.exceptions.ConnectionError):  # no plain HTTP on the port
            requests.get(server.url.replace("https", "http") + "/ping", timeout=30)
        assert "listening on https://" in server.log()


def test_client_certificates_when_the_server_asks_for_them(ca, tmp_path):
    server_cert, client_cert = ca.issue("server-m"), ca.issue("client-m", client=True)
    args = [
        "--model-id",
        str(tiny_model("llama")),
        *SYNTHETIC,
        "-o",
        f"certificate_file={server_cert.cert}",
        "-o",
        f"private_key_file={server_cert.key}",
        "-o",
        f"option.ssl_ca_certs={ca.issued.cert}",
    ]
    pair = (str(client_cert.cert), str(client_cert.key))
    with serve(args, tmp_path, ca=ca.issued.cert, client_cert=pair) as server:
        assert server.post("/invocations", json={"inputs": "Hello", "parameters": {"max_new_tokens": 3}}).ok
        with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
            server.get("/ping", cert=None)
        (tmp_path / "stranger").mkdir()
        stranger = Authority(tmp_path / "stranger", name="another CA").issue("client-x", client=True)
        with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
            server.get("/ping", cert=(str(stranger.cert), str(stranger.key)))
