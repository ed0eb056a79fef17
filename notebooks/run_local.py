"""Run one of this folder's notebooks headless in its local mode: no AWS account, no Docker, no GPU.

    python notebooks/run_local.py local_docker.ipynb
    python notebooks/run_local.py aot_compile.ipynb --param max_batch_size=8

From the repository root, after README.md's Quick start (``./models/tiny-llama``) and the development install
(nbclient, ipykernel, moto, sagemaker). The notebook's ``parameters`` cell keeps its defaults (AWS, Docker, a GPU);
the local ones (``LOCAL``, then each ``--param NAME=VALUE``, a Python literal or else a string) are injected in a
cell after it, as papermill does. The executed notebook is written to ``--out`` (default
``notebooks/out/NAME``); a cell that fails ends the run with its error and exit status 1.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).absolute().parent
ROOT = HERE.parent
MODEL = Path.cwd() / "models" / "tiny-llama"  # README.md's Quick start makes it, in the repository root
CELL_TIMEOUT_S = 120

# mode="local" and what each notebook needs for it: the Quick start's model and lengths (its 512 positions);
# for the ahead-of-time compile, the fake TensorRT-LLM (tests/fakes) behind the GPU stand-in (tests/fake_gpu).
COMMON: dict[str, Any] = {"mode": "local", "max_input_len": 384, "max_output_len": 128}
LOCAL: dict[str, dict[str, Any]] = {
    "local_docker.ipynb": {"model_id": str(MODEL)},
    "sagemaker_deploy.ipynb": {"local_model_dir": str(MODEL)},
    "aot_compile.ipynb": {
        "local_model_dir": str(MODEL),
        "local_pythonpath": f"{ROOT / 'tests' / 'fake_gpu'}:{ROOT / 'tests' / 'fakes'}",
        "max_batch_size": 4,
    },
}


def execute(name: str, params: dict[str, Any], out: Path, cwd: Path) -> Any:
    """Run notebook ``name`` with ``params`` injected after its parameters cell, in ``cwd``; the executed copy
    goes to ``out`` (also when a cell fails, for the post-mortem). Returns the executed notebook."""
    import nbclient
    import nbformat

    nb = nbformat.read(HERE / name, as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    injected = nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in {**COMMON, **params}.items()))
    injected.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(at + 1, injected)
    cwd.mkdir(parents=True, exist_ok=True)
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    )
    try:
        client.execute()
    finally:
        out.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out)
    return nb


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebook", choices=sorted(LOCAL))
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="a parameter (repeatable)")
    ap.add_argument("--out", type=Path, help="where the executed notebook goes (default: notebooks/out/NAME)")
    args = ap.parse_args(argv)
    if not MODEL.is_dir():
        print(
            f"error: {MODEL} does not exist: run `python tests/tinymodels.py ./models/tiny-llama` first",
            file=sys.stderr,
        )
        return 2
    params = dict(LOCAL[args.notebook])
    for item in args.param:
        name, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--param {item!r}: expected NAME=VALUE")
        params[name.strip()] = _literal(value.strip())
    out = args.out or HERE / "out" / args.notebook
    from nbclient.exceptions import CellExecutionError

    try:
        execute(args.notebook, params, out, cwd=out.parent)
    except CellExecutionError as e:
        print(f"error: {args.notebook}: a cell failed (the executed notebook is in {out}):\n{e}", file=sys.stderr)
        return 1
    print(f"{args.notebook}: every cell ran; the executed notebook is in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
