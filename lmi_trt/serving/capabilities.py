"""``GET /v1/capabilities``: what this engine, on this release, honours and refuses, and under which field of
each schema a request asks for it.

No peer server has it. It is printed from the tables the server refuses with: the engine's ``Capabilities``
(``lmi_trt.engines.base``; each engine declares every feature, with the reason where it refuses one) and
each schema's feature → field names (``register_feature_fields``, the names its 400s use), so a feature
shown as refused is the one a request gets a 400 for, with the same reason.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aiohttp import web

from lmi_trt.engines.base import Capabilities
from lmi_trt.serving.http import CONTEXT, ServingContext, json_response

PATH = "/v1/capabilities"


def describe(ctx: ServingContext) -> dict[str, Any]:
    """The document the route answers with (pure over the context)."""
    service = ctx.require_service()
    engine = service.engine
    caps = engine.capabilities
    features: dict[str, Any] = {}
    for name, capability in caps.features().items():
        entry: dict[str, Any] = {"honoured": capability.honoured, "description": Capabilities.doc(name)}
        if capability.most is not None:
            entry["most"] = capability.most
        if capability.reason:
            entry["reason" if not capability.honoured else "note"] = capability.reason
        entry["fields"] = {schema: names[name] for schema, names in ctx.feature_fields.items() if name in names}
        features[name] = entry
    return {
        "model": ctx.model_name,
        "engine": engine.name,
        "release": caps.release,
        "limits": dataclasses.asdict(engine.limits),
        "features": features,
    }


async def capabilities(request: web.Request) -> web.Response:
    """What this engine, on this release, honours and refuses, and each schema's field for it."""
    return json_response(describe(request.app[CONTEXT]))


def install(app: web.Application, ctx: ServingContext) -> None:
    app.router.add_get(PATH, capabilities)
