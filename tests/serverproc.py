"""Serving-layer test helpers: the tiny tokenizer and an app on the synthetic engine."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from tinymodels import build_tokenizer, cache_root

from lmi_trt.config import LmiConfig
from lmi_trt.engines.synthetic import SyntheticEngine
from lmi_trt.serving.app import build_app
from lmi_trt.serving.core import LoadedModel
from lmi_trt.serving.http import ProtocolAdapter
from lmi_trt.serving.tokenizer import load_tokenizer


def tokenizer_dir() -> Path:
    out = cache_root() / "tokenizer-only"
    if not (out / "tokenizer.json").exists():
        out.mkdir(parents=True, exist_ok=True)
        build_tokenizer(out)
    return out


@lru_cache(maxsize=1)
def tiny_tokenizer() -> Any:
    return load_tokenizer(tokenizer_dir())


def synthetic_engine(
    tokenizer: Any, engine_class: type[SyntheticEngine] = SyntheticEngine, **kwargs: Any
) -> SyntheticEngine:
    return engine_class(
        len(tokenizer), eos_token_id=tokenizer.eos_token_id, special_token_ids=tokenizer.all_special_ids, **kwargs
    )


class SyntheticApp:
    """An app whose load waits for ``gate`` (set by default) and then starts a synthetic engine."""

    def __init__(
        self,
        config: LmiConfig,
        *,
        model_name: str = "tiny",
        gate_open: bool = True,
        fail_load: str | None = None,
        adapters: Sequence[ProtocolAdapter] | None = None,
        **engine_kwargs: Any,
    ) -> None:
        self.tokenizer = tiny_tokenizer()
        engine_kwargs.setdefault("max_input_len", config.max_input_len)
        engine_kwargs.setdefault("max_new_tokens", config.max_output_len)
        self.engine = synthetic_engine(self.tokenizer, **engine_kwargs)
        self.gate = asyncio.Event()
        if gate_open:
            self.gate.set()
        self.fail_load = fail_load
        self.app = build_app(self._load, config, model_name=model_name, adapters=adapters)

    async def _load(self) -> LoadedModel:
        await self.gate.wait()
        if self.fail_load:
            raise RuntimeError(self.fail_load)
        await self.engine.start()
        return LoadedModel(self.engine, self.tokenizer)


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]], timeout: float = 3.0, interval: float = 0.01
) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return True
        if loop.time() > deadline:
            return False
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def serve_all_schemas(config: LmiConfig | None = None, **kw: Any):
    """A ready in-process server with every protocol adapter; yields (client session, SyntheticApp)."""
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    from lmi_trt.serving.protocols import DEFAULT_ADAPTERS

    sa = SyntheticApp(config or LmiConfig(max_input_len=128, max_output_len=256), adapters=DEFAULT_ADAPTERS, **kw)
    async with TestServer(sa.app) as server, ClientSession(str(server.make_url(""))) as s:

        async def ready() -> bool:
            async with s.get("/ping") as r:
                return r.status == 200

        assert await wait_until(ready)
        yield s, sa


async def post(s: Any, path: str, body: Any) -> tuple[int, str, bytes]:
    async with s.post(path, json=body) as r:
        return r.status, r.content_type, await r.read()
