"""option.api_key and X-Request-Id, in-process on every schema: which routes need the key, the forms of
Authorization accepted, the configuration's spellings, and the id's way from the request to the response
headers (streams too) and the OpenAI ids."""

from __future__ import annotations

import hashlib
import logging

import pytest
from serverproc import serve_all_schemas

from lmi_trt.config import ConfigError, LmiConfig, load_config, log_effective_config
from lmi_trt.log_context import REQUEST_ID, install_request_tag, log_format
from lmi_trt.serving.access import PUBLIC_ROUTES, authorized, choose_request_id, key_digests

KEYS = ("k-one-0123456789", "k-two-9876543210")


# --- pure parts ---
def test_request_ids_are_the_clients_when_plain_and_short_else_new():
    assert choose_request_id(["abc-123", "sm-id"]) == "abc-123"
    assert choose_request_id([None, "sm-id"]) == "sm-id"  # SageMaker's InferenceId when no X-Request-Id
    uuid_hex = choose_request_id([None, None])
    assert len(uuid_hex) == 32 and uuid_hex != choose_request_id([None, None])
    for bad in ("", "x" * 129, "a b", "line\nbreak", "ümlaut", "a;b"):
        assert choose_request_id([bad, None]) != bad
    trace = "Root=1-67891233-abcdef012345678912345678/x+y@z:1.2"
    assert choose_request_id([trace, None]) == trace


def test_only_bearer_with_one_of_the_keys_is_authorized():
    digests = key_digests(KEYS)
    assert authorized(f"Bearer {KEYS[0]}", digests) and authorized(f"bearer {KEYS[1]}", digests)
    for header in (None, "", KEYS[0], f"Basic {KEYS[0]}", f"Bearer {KEYS[0]}x", "Bearer ", f"Bearer  {KEYS[0]}"):
        assert not authorized(header, digests), header
    assert hashlib.sha256(KEYS[0].encode()).digest() in digests  # what is kept is digests, compared in full


def test_api_key_spellings_and_masking(caplog):
    config = load_config(overrides={"option.rolling_batch": "synthetic", "option.api_key": " a-key-123456 , b-key "})
    assert config.api_keys() == ("a-key-123456", "b-key")
    from_vllm = load_config(env={"VLLM_API_KEY": "v-key-123456"}, overrides={"option.rolling_batch": "synthetic"})
    assert from_vllm.api_keys() == ("v-key-123456",)
    both = load_config(
        env={"VLLM_API_KEY": "v-key-123456", "OPTION_API_KEY": "o-key-123456"},
        overrides={"option.rolling_batch": "synthetic"},
    )
    assert both.api_keys() == ("o-key-123456",)  # the LMI variable wins over the alias, as for every alias
    with caplog.at_level(logging.INFO):
        log_effective_config(both, logging.getLogger("test"))
    assert "o-key-123456" not in caplog.text and "v-key-123456" not in caplog.text
    assert "option.api_key = ****" in caplog.text
    for bad in ("a,,b", "with space", "tab\tkey"):
        with pytest.raises(ConfigError, match="option.api_key='\\*\\*\\*\\*'"):  # refused, still masked
            load_config(overrides={"option.rolling_batch": "synthetic", "option.api_key": bad})


def test_a_log_line_names_the_request_it_is_about():
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(log_format()))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        install_request_tag()
        record = logging.LogRecord("lmi_trt.x", logging.WARNING, __file__, 1, "slow body", None, None)
        token = REQUEST_ID.set("abc-123")
        try:
            handler.handle(record)  # the filter runs where the line is logged
            assert handler.format(record).endswith("lmi_trt.x [abc-123]: slow body")
        finally:
            REQUEST_ID.reset(token)
        handler.handle(record)
        assert handler.format(record).endswith("lmi_trt.x: slow body")
    finally:
        root.removeHandler(handler)


# --- in-process server ---
def served(**config):
    return serve_all_schemas(LmiConfig(max_input_len=128, max_output_len=64, **config))


def routes(app) -> set[tuple[str, str]]:
    return {
        (r.method, r.resource.canonical)
        for r in app.router.routes()
        if r.method in ("GET", "POST") and r.resource is not None
    }


async def test_every_route_but_probes_and_metrics_needs_a_key():
    async with served(api_key=",".join(KEYS)) as (s, sa):
        checked = 0
        for method, path in sorted(routes(sa.app)):
            url = path.replace("{model}", "tiny").replace("{version}", "1").replace("{endpoint}", "tiny")
            async with s.request(method, url, json={}) as r:
                if path in PUBLIC_ROUTES:
                    assert r.status != 401, path
                else:
                    assert r.status == 401 and r.headers["WWW-Authenticate"] == "Bearer", (path, r.status)
                    body = await r.json()
                    assert body["code"] == 401 and "Authorization: Bearer" in body["error"]
                    checked += 1
        assert checked >= 15  # /invocations, /v1/*, /generate*, /v2/models/*/generate*, /endpoints/*, ...
        async with s.get("/v1/models", headers={"Authorization": f"Bearer {KEYS[1]}"}) as r:
            assert r.status == 200
        async with s.get("/v1/models", headers={"Authorization": "Bearer not-the-key"}) as r:
            assert r.status == 401 and "not carry a valid API key" in (await r.json())["error"]
        async with s.get("/metrics") as r:
            assert 'status="401"' in await r.text()  # refusals are counted


async def test_without_a_key_configured_nothing_asks_for_one():
    async with served() as (s, _):
        async with s.get("/v1/models") as r:
            assert r.status == 200
        async with s.get("/openapi.json") as r:
            assert "security" not in await r.json()


async def test_the_openapi_document_says_which_routes_need_the_key():
    async with served(api_key=KEYS[0]) as (s, _):
        async with s.get("/openapi.json") as r:
            doc = await r.json()
    assert doc["security"] == [{"apiKey": []}]
    assert doc["components"]["securitySchemes"]["apiKey"] == {"type": "http", "scheme": "bearer"}
    for path, ops in doc["paths"].items():
        for op in ops.values():
            assert (op.get("security") == []) == (path in PUBLIC_ROUTES), path


async def test_the_request_id_comes_back_in_headers_and_openai_ids_streams_too():
    async with served() as (s, _):
        body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
        async with s.post("/v1/chat/completions", json=body, headers={"X-Request-Id": "abc-123"}) as r:
            assert r.headers["X-Request-Id"] == "abc-123" and (await r.json())["id"] == "chatcmpl-abc-123"
        async with s.post("/v1/chat/completions", json={**body, "stream": True}, headers={"X-Request-Id": "s-1"}) as r:
            assert r.headers["X-Request-Id"] == "s-1" and b'"id":"chatcmpl-s-1"' in await r.read()
        async with s.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2}) as r:
            made = r.headers["X-Request-Id"]
            assert len(made) == 32 and (await r.json())["id"] == f"cmpl-{made}"
        async with s.post("/invocations", json={"inputs": "Hi", "stream": True}, headers={"X-Request-Id": "a\tb"}) as r:
            assert r.status == 200 and r.headers["X-Request-Id"] != "a\tb"
        headers = {"X-Amzn-SageMaker-Inference-Id": "sm-42"}
        async with s.post("/invocations", json={"nope": 1}, headers=headers) as r:
            assert r.status == 400 and r.headers["X-Request-Id"] == "sm-42"  # errors carry it too
        async with s.get("/no/such/route", headers={"X-Request-Id": "nf-1"}) as r:
            assert r.status == 404 and r.headers["X-Request-Id"] == "nf-1"
