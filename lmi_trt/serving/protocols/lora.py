"""LoRA adapter management at run time: DJL's adapter management API and vLLM's load/unload routes.

DJL (djl-serving serving/docs/adapters_api.md, adapters.md):
``POST /models/{model}/adapters?name=&src=`` registers (``{"status": "Adapter a1 registered"}``),
``GET /models/{model}/adapters`` lists (``{"adapters": [{"name", "src", "pin"}]}``),
``GET /models/{model}/adapters/{name}`` describes (a list of one), ``DELETE /models/{model}/adapters/{name}``
unregisters; for a single model ``/models/{model}`` may be left out (``/adapters``). Its ``preload`` (default true)
and ``pin`` (default false) are taken at those values only: adapters here are always read at registration, and
the device slots are shared least-recently-used (nothing is pinned). DJL passes any other query argument to the
model handler as an adapter option; none is defined here, so one is a 400 naming it.

vLLM (vllm/entrypoints/openai/api_server.py and serving_models.py): ``POST /v1/load_lora_adapter``
``{"lora_name", "lora_path"}`` and ``POST /v1/unload_lora_adapter`` ``{"lora_name"}``, answering plain text.

``src`` / ``lora_path``: a local folder, ``s3://bucket/prefix`` or a Hugging Face repo id (from the hub cache
when offline), fetched through the sources stage as models are. An adapter requests are using is not
unregistered (409). Registered adapters are the OpenAI ``/v1/models`` entries after the base model.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from lmi_trt.engines.base import AdapterInfo
from lmi_trt.serving.errors import FieldError, NotFound, check_model
from lmi_trt.serving.http import CONTEXT, Body, ServingContext, add_post, json_response, load_json, read_body, validate
from lmi_trt.serving.protocols._common import errors_as
from lmi_trt.serving.protocols.openai import openai_error

# DJL's register arguments and the only values honoured here (see the module docstring).
_DJL_FIXED = {"preload": "true", "pin": "false"}


def _card(a: AdapterInfo) -> dict[str, Any]:
    return {"name": a.name, "src": a.src, "pin": False}


def _check(request: web.Request) -> ServingContext:
    ctx = request.app[CONTEXT]
    model = request.match_info.get("model")
    if model is not None:
        check_model(model, ctx.model_name, also=[ctx.config.model_id] if ctx.config.model_id else [])
    return ctx


def _find(ctx: ServingContext, name: str) -> AdapterInfo:
    found = next((a for a in ctx.require_service().adapters() if a.name == name), None)
    if found is None:
        raise NotFound(f"adapter {name!r} is not registered")
    return found


async def djl_list(request: web.Request) -> web.Response:
    ctx = _check(request)
    return json_response({"adapters": [_card(a) for a in ctx.require_service().adapters()]})


async def djl_describe(request: web.Request) -> web.Response:
    ctx = _check(request)
    return json_response([_card(_find(ctx, request.match_info["adapter"]))])


async def djl_register(request: web.Request) -> web.Response:
    ctx = _check(request)
    args = dict(request.query)
    name, src = args.pop("name", None), args.pop("src", None)
    for key, honoured in _DJL_FIXED.items():
        value = args.pop(key, honoured)
        if value.lower() != honoured:
            raise FieldError(key, f"{key}={value}: adapters here are taken with {key}={honoured} only")
    if args:
        raise FieldError(next(iter(args)), f"unknown adapter argument(s) {sorted(args)}: name, src, preload, pin")
    if not name or not src:
        raise FieldError("name" if not name else "src", "register an adapter with ?name=<name>&src=<folder|s3|hub id>")
    info = await ctx.require_service().register_adapter(name, src)
    return json_response({"status": f"Adapter {info.name} registered"})


async def djl_unregister(request: web.Request) -> web.Response:
    ctx = _check(request)
    name = request.match_info["adapter"]
    await ctx.require_service().unregister_adapter(name)
    return json_response({"status": f"Adapter {name} unregistered"})


class UnloadLoraAdapterRequest(BaseModel):
    """vLLM's UnloadLoRAAdapterRequest (vllm/entrypoints/openai/protocol.py): the name; its lora_int_id is vLLM's
    internal id, which nothing here has (refused as an unknown field)."""

    model_config = ConfigDict(strict=True, extra="forbid")
    lora_name: str


class LoadLoraAdapterRequest(UnloadLoraAdapterRequest):
    """vLLM's LoadLoRAAdapterRequest: the name and the adapter's path (here also s3:// or a hub id)."""

    lora_path: str


async def _body(request: web.Request, model: type[BaseModel]) -> Any:
    return validate(model, await load_json(request, await read_body(request)))


@errors_as(openai_error)
async def vllm_load(request: web.Request) -> web.Response:
    body = await _body(request, LoadLoraAdapterRequest)
    await request.app[CONTEXT].require_service().register_adapter(body.lora_name, body.lora_path)
    return web.Response(text=f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@errors_as(openai_error)
async def vllm_unload(request: web.Request) -> web.Response:
    body = await _body(request, UnloadLoraAdapterRequest)
    await request.app[CONTEXT].require_service().unregister_adapter(body.lora_name)
    return web.Response(text=f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


def install(app: web.Application, ctx: ServingContext) -> None:
    if not ctx.config.enable_lora:  # the routes exist only where adapters are served
        return
    for base in ("/models/{model}/adapters", "/adapters"):
        app.router.add_get(base, djl_list)
        app.router.add_post(base, djl_register)
        app.router.add_get(base + "/{adapter}", djl_describe)
        app.router.add_delete(base + "/{adapter}", djl_unregister)
    add_post(app, "/v1/load_lora_adapter", vllm_load, Body((LoadLoraAdapterRequest,)))
    add_post(app, "/v1/unload_lora_adapter", vllm_unload, Body((UnloadLoraAdapterRequest,)))
