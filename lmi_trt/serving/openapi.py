"""``GET /openapi.json``: an OpenAPI 3.1 description of every route this server answers.

Request bodies come from the protocol adapters' own pydantic models (the ones that validate
the requests), registered with each route as it is added (``lmi_trt.serving.http.add_post``), so the
description cannot drift from what is enforced and a new route needs no edit here. Routes are read
from the application's router when the document is first asked for.

Install it as the last protocol adapter: ``build_app(..., adapters=(*DEFAULT_ADAPTERS, openapi.install))``.
The fuzz tests (``tests/integration/test_reliability_fuzz.py``) drive the real server from it.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
from typing import Any

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from lmi_trt import __version__
from lmi_trt.serving.access import PUBLIC_ROUTES
from lmi_trt.serving.http import CONTEXT, ROUTE_BODIES, Body, ServingContext

log = logging.getLogger(__name__)

OPENAPI_PATH = "/openapi.json"
_SPEC: web.AppKey[dict[str, Any]] = web.AppKey("lmi_openapi_spec", dict)

_WORDS = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
# Fields the models type as ``Any`` because a validator checks them by hand (to name the field in
# one error instead of one per union member); here they get the shape that validator accepts.
FIELD_SHAPES: dict[tuple[str, str], dict[str, Any]] = {
    ("LmiRequest", "inputs"): {
        "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}],
        "description": "the prompt, or a list of prompts (json output only)",
    },
    ("ChatRequest", "messages"): {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "role": {"type": "string", "minLength": 1},
                "content": {
                    "anyOf": [
                        {"type": "string"},
                        {"type": "null"},
                        {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["type", "text"],
                                "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
                            },
                        },
                    ]
                },
            },
        },
    },
    ("CompletionRequest", "prompt"): {
        "anyOf": [
            {"type": "string"},
            _TOKEN_IDS,
            {"type": "array", "minItems": 1, "items": {"anyOf": [{"type": "string"}, _TOKEN_IDS]}},
        ],
    },
    ("TritonRequest", "bad_words"): _WORDS,
    ("TritonRequest", "stop_words"): _WORDS,
    ("TrussRequest", "bad_words_list"): _WORDS,
    ("TrussRequest", "stop_words_list"): _WORDS,
}

_ERROR = {
    "description": "an error: a JSON body whose message names the offending field (shape per schema: "
    "LMI {error, code, type}, OpenAI {error: {message, param, ...}}, TGI {error, error_type}, "
    "Triton {error})",
    "content": {"application/json": {"schema": {"type": "object"}}},
}
_PARAM = re.compile(r"\{([^}:]+)(?::[^}]*)?\}")


def component_schemas(models: set[type[BaseModel]]) -> dict[str, Any]:
    """The models' JSON schemas (validation mode) as ``components.schemas``, by class name."""
    if not models:
        return {}
    _, defs = models_json_schema(
        [(m, "validation") for m in sorted(models, key=lambda m: m.__name__)],
        ref_template="#/components/schemas/{model}",
    )
    schemas = defs.get("$defs", {})
    for (model, field_name), shape in FIELD_SHAPES.items():
        props = schemas.get(model, {}).get("properties", {})
        if field_name in props:
            props[field_name] = {**shape, "title": props[field_name].get("title", field_name)}
    return schemas


def body_models(body: Body, ctx: ServingContext) -> tuple[type[BaseModel], ...]:
    """The request models a route's body is one of, the invocation handlers' included where it takes them."""
    return body.models + (tuple(ctx.invocation_models) if body.invocations else ())


def _summary(handler: Any) -> str:
    doc = inspect.getdoc(inspect.unwrap(handler)) or ""
    return doc.strip().splitlines()[0] if doc.strip() else getattr(handler, "__name__", "handler")


def _operation_id(method: str, path: str) -> str:
    return method.lower() + (re.sub(r"[^A-Za-z0-9]+", "_", path).strip("_") or "root")


def build_spec(app: web.Application) -> dict[str, Any]:
    """The OpenAPI document for ``app``'s routes as they are now."""
    ctx: ServingContext = app[CONTEXT]
    routes: list[tuple[str, str, Any]] = []
    for route in app.router.routes():
        resource = route.resource
        if resource is None or route.method in ("HEAD", "OPTIONS", "*"):
            continue
        routes.append((resource.canonical, route.method, route.handler))
    bodies = app.get(ROUTE_BODIES, {})
    schemas = component_schemas({m for body in bodies.values() for m in body_models(body, ctx)})
    paths: dict[str, dict[str, Any]] = {}
    for path, method, handler in routes:
        op: dict[str, Any] = {
            "operationId": _operation_id(method, path),
            "summary": _summary(handler),
            "responses": {"200": {"description": "success"}, "4XX": _ERROR, "5XX": _ERROR},
        }
        params = _PARAM.findall(path)
        if params:
            op["parameters"] = [
                {"name": p, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
                for p in params
            ]
        if method in ("POST", "PUT", "PATCH"):
            body = bodies.get(path)
            if body is None:  # every adapter registers its POST routes with their bodies (http.add_post)
                raise RuntimeError(
                    f"{method} {path} was added without its request body; register it with "
                    "lmi_trt.serving.http.add_post"
                )
            refs = [{"$ref": f"#/components/schemas/{m.__name__}"} for m in body_models(body, ctx)]
            json_schema: dict[str, Any] = refs[0] if len(refs) == 1 else {"anyOf": refs}
            content: dict[str, Any] = {"application/json": {"schema": json_schema}}
            if body.text:
                content["text/plain"] = {"schema": {"type": "string", "minLength": 1}}
            op["requestBody"] = {"required": True, "content": content}
        if ctx.config.api_key is not None and path in PUBLIC_ROUTES:
            op["security"] = []  # open without the key
        paths.setdefault(path, {})[method.lower()] = op
    components: dict[str, Any] = {"schemas": schemas}
    security: dict[str, Any] = {}
    if ctx.config.api_key is not None:  # option.api_key: Authorization: Bearer <key> (serving.access)
        components["securitySchemes"] = {"apiKey": {"type": "http", "scheme": "bearer"}}
        security["security"] = [{"apiKey": []}]
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "lmi-trt",
            "version": __version__,
            "description": f"LLM inference for model {ctx.model_name!r}: LMI/DJL, SageMaker, TGI, OpenAI, "
            "Triton generate and Truss schemas.",
        },
        "paths": dict(sorted(paths.items())),
        "components": components,
        **security,
    }


async def openapi_json(request: web.Request) -> web.Response:
    """This document."""
    cache = request.app[_SPEC]
    if "doc" not in cache:  # the router is frozen once serving, so the document is built once
        # the stdlib encoder: bounds such as seed < 2**64 are beyond orjson's 64-bit integers
        cache["doc"] = json.dumps(build_spec(request.app)).encode()
    return web.Response(body=cache["doc"], content_type="application/json")


def install(app: web.Application, ctx: ServingContext) -> None:
    app[_SPEC] = {}
    app.router.add_get(OPENAPI_PATH, openapi_json)


__all__ = ["FIELD_SHAPES", "OPENAPI_PATH", "build_spec", "install"]
