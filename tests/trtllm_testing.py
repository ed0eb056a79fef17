"""Test helpers for the TensorRT-LLM fake: install it for a while, and build engine folders with
its build API exactly as real code would (as NVIDIA/TensorRT-LLM tensorrt_llm/commands/build.py drives it)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

FAKES = Path(__file__).parent / "fakes"
# On PYTHONPATH before FAKES: lmi-trt processes take the GPU check as passed (fake_gpu/sitecustomize.py).
FAKE_GPU = Path(__file__).parent / "fake_gpu"


@contextmanager
def fake_tensorrt_llm(version: str | None = None) -> Iterator:
    """``import tensorrt_llm`` resolves to the fake inside the block; outside it nothing is left
    behind (other tests must still see TensorRT-LLM as absent). Without ``version`` the fake
    impersonates ``LMI_TRT_FAKE_RELEASE`` (default 1.0.0)."""
    added = str(FAKES) not in sys.path
    if added:
        sys.path.insert(0, str(FAKES))
    try:
        import tensorrt_llm

        if version is not None:
            tensorrt_llm.__version__ = version
        yield tensorrt_llm
    finally:
        for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
            del sys.modules[name]
        if added:
            sys.path.remove(str(FAKES))


def make_engine_dir(
    hf_dir: Path,
    out_dir: Path,
    *,
    tp_size: int = 1,
    pp_size: int = 1,
    dtype: str = "auto",
    plugin_config: dict | None = None,
    **build_config,
) -> Path:
    """Convert and build every rank of ``hf_dir`` into ``out_dir`` (config.json + rank{r}.engine).

    Needs the fake (or real) ``tensorrt_llm`` importable; ``build_config`` are ``BuildConfig`` keywords.
    """
    from tensorrt_llm import BuildConfig, Mapping
    from tensorrt_llm.builder import build
    from tensorrt_llm.models import MODEL_MAP
    from tensorrt_llm.plugin import PluginConfig

    arch = json.loads((Path(hf_dir) / "config.json").read_text())["architectures"][0]
    world = tp_size * pp_size
    for rank in range(world):
        mapping = Mapping(world_size=world, rank=rank, tp_size=tp_size, pp_size=pp_size)
        model = MODEL_MAP[arch].from_hugging_face(str(hf_dir), dtype=dtype, mapping=mapping)
        plugins = PluginConfig()  # keywords are a TypeError in 0.12–1.1 (a slots dataclass, init=False fields)
        for name, value in (plugin_config or {}).items():
            setattr(plugins, name, value)
        config = BuildConfig(**build_config, plugin_config=plugins)
        build(model, config).save(str(out_dir))
    return Path(out_dir)


# The one hardware seam of a server process on this GPU-less host: TensorRT-LLM's GPU probe answers yes.
GPU_SEAM = "import lmi_trt.engines.trtllm as _trt\n_trt.cuda_available = lambda: True\n"


def fake_server_env(site_dir: Path, version: str | None = None) -> dict[str, str]:
    """Environment for an `lmi-trt serve` process that imports the fake TensorRT-LLM (as ``version``, else the
    release ``LMI_TRT_FAKE_RELEASE`` names) and sees a GPU: ``site_dir`` gets the seam as its sitecustomize."""
    import os

    (site_dir / "sitecustomize.py").write_text(GPU_SEAM)
    path = os.pathsep.join([str(site_dir), str(FAKES), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {"PYTHONPATH": path, **({"LMI_TRT_FAKE_RELEASE": version} if version else {})}
