"""The package's shape (issues 14 and 25): no import circle anywhere in lmi_trt, counting every import (inside
functions and under TYPE_CHECKING too: a deferred import is a circle kept from failing, not the absence of one),
and the engine registry imports no stage;
the protocol adapters take their toolkit from serving.http, not from the application module; /openapi.json
documents a route from its registration, so a new adapter's route needs no edit in openapi.py; the compile
stage imports neither the configuration nor the engines."""

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
    """The lmi_trt modules ``path`` imports anywhere in it (module level, inside functions, under TYPE_CHECKING);
    ``from package import module`` counts as importing the module, not the package around it."""
    out: set[str] = set()
    modules = {_module(p) for p in PACKAGE.rglob("*.py")}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
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


def _graph() -> dict[str, set[str]]:
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in _imports(path, name) if m in modules and m != name} for name, path in modules.items()}


def _circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan): each is one or more import circles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


def test_no_import_circle_in_the_package():
    circles = [sorted(c) for c in _circles(_graph())]
    assert not circles, f"import circles (every import counted): {circles}"


def test_the_registry_is_a_leaf():
    # The registry holds facts; the wiring that builds stages from them (lmi_trt.stages) sits above it.
    imported = _graph()["lmi_trt.engines.registry"]
    assert imported <= {"lmi_trt.errors", "lmi_trt.vocabulary"}, imported


def test_the_circle_finder_sees_deferred_imports(tmp_path):
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset({"a", "b", "c"})}
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from lmi_trt.launch import LaunchPlan\n"
        "def f():\n    from lmi_trt.config import LmiConfig\n"
    )
    assert _imports(module, "lmi_trt.m") == {"lmi_trt.config", "lmi_trt.launch"}


def test_the_torch_engine_modules_import_no_private_name():
    for path in (PACKAGE / "engines" / "torch").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("lmi_trt")):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.name} imports {private} from {node.module}"


def test_the_compile_stage_sees_neither_the_configuration_nor_the_engines():
    graph = _graph()
    seen = {
        f"{name} → {m}"
        for name, imported in graph.items()
        if name.startswith("lmi_trt.compile")
        for m in imported
        if m == "lmi_trt.config" or m.startswith("lmi_trt.engines")
    }
    assert not seen


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
