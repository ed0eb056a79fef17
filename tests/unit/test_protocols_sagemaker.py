"""The SageMaker runtime emulation: event-stream framing checked with botocore's own parser, and
boto3's sagemaker-runtime client (run on a thread) against the in-process server."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import aiohttp
import boto3
import pytest
from aiohttp.test_utils import TestServer
from botocore.config import Config
from botocore.eventstream import ChecksumMismatch, EventStreamBuffer
from botocore.exceptions import EventStreamError
from serverproc import SyntheticApp, tiny_tokenizer, wait_until

from lmi_trt.config import LmiConfig
from lmi_trt.serving.http import parse_custom_attributes
from lmi_trt.serving.protocols import DEFAULT_ADAPTERS
from lmi_trt.serving.protocols.sagemaker import (
    encode_event,
    exception_event,
    payload_part,
    utf8_boundary,
)

MULTI = "Grüße aus München! 日本語のテキスト 🚀🔥✨ "


def parse_events(raw: bytes) -> list[Any]:
    buf = EventStreamBuffer()
    buf.add_data(raw)
    return list(buf)


def test_payload_part_frames_parse_with_botocore():
    data = MULTI.encode() * 3
    raw = payload_part(data) + payload_part(b"") + payload_part(b"x")
    msgs = parse_events(raw)
    assert [m.payload for m in msgs] == [data, b"", b"x"]
    assert msgs[0].headers == {
        ":event-type": "PayloadPart",
        ":content-type": "application/octet-stream",
        ":message-type": "event",
    }
    assert msgs[0].to_response_dict()["status_code"] == 200


def test_exception_event_and_crc_checked():
    (msg,) = parse_events(exception_event("ModelStreamError", "it broke", "StreamBroken"))
    assert msg.headers[":message-type"] == "exception" and msg.headers[":exception-type"] == "ModelStreamError"
    assert json.loads(msg.payload) == {"Message": "it broke", "ErrorCode": "StreamBroken"}
    assert msg.to_response_dict()["status_code"] == 400
    raw = bytearray(encode_event({"a": "b"}, b"payload"))
    raw[-6] ^= 1  # flip a payload bit: the message CRC no longer matches
    with pytest.raises(ChecksumMismatch):
        parse_events(bytes(raw))


def test_utf8_boundary_never_splits_a_character():
    data = MULTI.encode()
    for cut in range(len(data) + 1):
        whole, rest = utf8_boundary(data[:cut])
        whole.decode()
        assert whole + rest == data[:cut] and len(rest) < 4
    assert utf8_boundary(b"\xff\xfe") == (b"\xff\xfe", b"")  # not UTF-8: passed through


def test_custom_attributes_header_parsing():
    assert parse_custom_attributes("a=1; b = two ;c=;flag") == {"a": "1", "b": "two", "c": "", "flag": ""}


@contextlib.asynccontextmanager
async def runtime(config: LmiConfig | None = None, **kw: Any):
    """The server in-process plus a boto3 sagemaker-runtime client pointed at it (call it on a thread)."""
    sa = SyntheticApp(config or LmiConfig(max_input_len=128, max_output_len=256), adapters=DEFAULT_ADAPTERS, **kw)
    async with TestServer(sa.app, host="127.0.0.1") as server, aiohttp.ClientSession(str(server.make_url(""))) as s:

        async def ready() -> bool:
            async with s.get("/ping") as r:
                return r.status == 200

        assert await wait_until(ready)
        client = boto3.client(
            "sagemaker-runtime",
            endpoint_url=str(server.make_url("")).rstrip("/"),
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
            config=Config(retries={"max_attempts": 1}, read_timeout=30),
        )
        yield client, sa


def n_tokens(text: str) -> int:
    return len(tiny_tokenizer().encode(text))


async def test_invoke_endpoint_and_model_error():
    async with runtime() as (client, _):
        body = json.dumps({"inputs": MULTI, "parameters": {"max_new_tokens": 2 * n_tokens(MULTI)}})
        r = await asyncio.to_thread(
            client.invoke_endpoint,
            EndpointName="my-endpoint",
            Body=body,
            ContentType="application/json",
            Accept="application/json",
            CustomAttributes="trace=1",
        )
        assert r["ContentType"] == "application/json" and r["InvokedProductionVariant"] == "AllTraffic"
        assert json.loads(r["Body"].read()) == {"generated_text": MULTI * 2}

        bad = json.dumps({"inputs": "x", "parameters": {"max_new_tokens": 0}})
        with pytest.raises(client.exceptions.ModelError) as e:
            await asyncio.to_thread(
                client.invoke_endpoint, EndpointName="my-endpoint", Body=bad, ContentType="application/json"
            )
        assert e.value.response["OriginalStatusCode"] == 400
        assert "max_new_tokens" in e.value.response["Error"]["Message"]
        assert json.loads(e.value.response["OriginalMessage"])["code"] == 400
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 424


async def test_validation_error_for_what_the_runtime_rejects():
    async with runtime(LmiConfig(max_request_size=1000)) as (client, _):
        with pytest.raises(client.exceptions.ValidationError, match="endpointName"):
            await asyncio.to_thread(client.invoke_endpoint, EndpointName="bad_name", Body=b"{}")
        with pytest.raises(client.exceptions.ValidationError, match="max_request_size"):
            await asyncio.to_thread(client.invoke_endpoint, EndpointName="ep", Body=b"x" * 2000)


async def test_response_stream_reassembles_and_parts_are_whole_characters():
    async with runtime() as (client, _):
        n = n_tokens(MULTI)
        body = json.dumps({"inputs": MULTI, "parameters": {"max_new_tokens": 2 * n}, "stream": True})
        r = await asyncio.to_thread(
            client.invoke_endpoint_with_response_stream, EndpointName="ep", Body=body, ContentType="application/json"
        )
        assert r["ContentType"] == "application/jsonlines"
        parts = await asyncio.to_thread(lambda: [ev["PayloadPart"]["Bytes"] for ev in r["Body"]])
        assert all(p.decode() is not None for p in parts)  # each part decodes on its own
        lines = [json.loads(x) for x in b"".join(parts).splitlines() if x.strip()]
        assert lines[-1]["generated_text"] == MULTI * 2 and len(lines) == 2 * n
        # a Truss body streams plain text through the same call
        r = await asyncio.to_thread(
            client.invoke_endpoint_with_response_stream,
            EndpointName="ep",
            Body=json.dumps({"prompt": MULTI, "max_tokens": 2 * n}),
        )
        text = await asyncio.to_thread(lambda: b"".join(ev["PayloadPart"]["Bytes"] for ev in r["Body"]).decode())
        assert text == MULTI * 2 and r["ContentType"].startswith("text/plain")


async def test_stream_errors_before_and_after_the_first_byte():
    async with runtime(tokens_per_second=100) as (client, sa):
        with pytest.raises(client.exceptions.ModelError, match="max_new_tokens"):
            await asyncio.to_thread(
                client.invoke_endpoint_with_response_stream,
                EndpointName="ep",
                Body=json.dumps({"inputs": "x", "parameters": {"max_new_tokens": 0}, "stream": True}),
            )
        r = await asyncio.to_thread(
            client.invoke_endpoint_with_response_stream,
            EndpointName="ep",
            Body=json.dumps({"prompt": "abc", "max_tokens": 250}),
        )
        events = iter(r["Body"])
        first = await asyncio.to_thread(next, events)
        assert first["PayloadPart"]["Bytes"]
        sa.engine.fail("boom")
        with pytest.raises(EventStreamError) as e:
            await asyncio.to_thread(lambda: list(events))
        assert e.value.response["Error"]["Code"] == "ModelStreamError"
