"""The serving package's shape (issue 14): no import circle anywhere in lmi_trt; the protocol adapters take
their toolkit from serving.http, not from the application module; /openapi.json documents a route from its
registration, so a new adapter's route needs no edit in openapi.py."""

from __future__ import annotations

import ast
from pathlib import Path

from aiohttp import web
from pydantic import BaseModel

from lmi_trt.config import LmiConfig
from lmi_trt.serving import openapi
from lmi_trt.serving.app import build_app
from lmi_trt.serving.http import Body, ServingContext, add_post
from lmi_trt.serving.protocols import lmi, openai, sagemaker, tgi, triton, truss

PACKAGE = Path(__file__).resolve().parents[2] / "lmi_trt"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str) -> set[str]:
    """The lmi_trt modules ``path`` imports at module level (imports inside functions are deferred on purpose);
    ``from package import module`` counts as importing the module, not the package around it."""
    out: set[str] = set()
    modules = {_module(p) for p in PACKAGE.rglob("*.py")}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            submodules = {f"{base}.{a.name}" for a in node.names} & modules
            out |= submodules if len(submodules) == len(node.names) else {base} | submodules
    return {m for m in out if m.startswith("lmi_trt")}


def test_no_import_circle_in_the_package():
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: {m for m in _imports(path, name) if m in modules and m != name} for name, path in modules.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import circle: " + " → ".join(stack[stack.index(nxt) :] + [nxt]))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


def test_adapters_do_not_import_the_application_module():
    for path in (PACKAGE / "serving" / "protocols").glob("*.py"):
        assert "lmi_trt.serving.app" not in _imports(path, _module(path)), path.name


class _EchoRequest(BaseModel):
    text: str


async def _echo(request: web.Request) -> web.Response:
    """Echo a text."""
    return web.json_response(await request.json())


def test_a_new_adapters_route_is_documented_from_its_registration():
    def install(app: web.Application, ctx: ServingContext) -> None:
        add_post(app, "/echo", _echo, Body((_EchoRequest,)))

    async def never() -> None:
        raise AssertionError("not loaded in this test")

    adapters = (
        lmi.install,
        openai.install,
        tgi.install,
        triton.install,
        truss.install,
        sagemaker.install,
        install,
        openapi.install,
    )
    app = build_app(never, LmiConfig(), model_name="m", adapters=adapters)
    spec = openapi.build_spec(app)
    body = spec["paths"]["/echo"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/_EchoRequest"}
    assert spec["components"]["schemas"]["_EchoRequest"]["required"] == ["text"]
    assert spec["paths"]["/echo"]["post"]["summary"] == "Echo a text."
