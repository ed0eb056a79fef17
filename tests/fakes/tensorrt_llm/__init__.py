"""A fake ``tensorrt_llm`` for tests on machines without TensorRT-LLM or a GPU.

Its names, constructor keywords (and their order), properties, methods and enum members are a
subset of the real API as listed in ``trtllm_api_surface.py`` (checked by
``tests/unit/test_fake_surface.py``). The build side writes the real engine layout; the executor
really generates, through the Hugging Face checkpoint an engine was built from.

The release it impersonates is ``LMI_TRT_FAKE_RELEASE`` (0.12.0, 1.0.0, 1.1.0 or 1.2.1; unset:
1.0.0, the Dockerfile's base image). ``tensorrt_llm.__version__`` can be assigned to switch in-process:
0.x gets the 0.12 shapes, 1.x the 1.x ones, 1.2 the pydantic ``PluginConfig``. Engines only load in
the release that built them.
"""

import sys
import types

from tensorrt_llm import _state


class _FakeTensorrtLlmModule(types.ModuleType):
    @property
    def __version__(self):
        return _state.version()

    @__version__.setter
    def __version__(self, value):
        _state.set_version(value)


sys.modules[__name__].__class__ = _FakeTensorrtLlmModule

from tensorrt_llm import bindings, builder, mapping, models, plugin, quantization  # noqa: E402
from tensorrt_llm.builder import BuildConfig  # noqa: E402
from tensorrt_llm.mapping import Mapping  # noqa: E402

__all__ = [
    "BuildConfig",
    "LLM",
    "Mapping",
    "SamplingParams",
    "bindings",
    "builder",
    "mapping",
    "models",
    "plugin",
    "quantization",
]


def __getattr__(name: str):
    # tensorrt_llm.LLM / SamplingParams: the LLM API (PyTorch backend, 1.0+; listed in llmapi_surface.py).
    # Resolved on first use so the Executor fake's namespace stays what trtllm_api_surface.py lists.
    if name in ("LLM", "SamplingParams"):
        from tensorrt_llm import llmapi

        return getattr(llmapi, name)
    raise AttributeError(f"module 'tensorrt_llm' has no attribute {name!r}")
