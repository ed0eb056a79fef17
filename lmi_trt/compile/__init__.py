"""The compile stage: HF checkpoint → TensorRT-LLM engine, planned first, cached, built per rank.

Modules: ``options`` (CompileOptions), ``archs`` (architecture registry), ``plan`` (BuildPlan,
memory estimate), ``quant`` (quantization + modelopt calibration), ``cache`` (engine cache),
``build`` (execution through TensorRT-LLM), ``jit`` (serve/compile entry points), ``hf_quant``
(the pytorch backend's calibrated checkpoint), ``probe`` (this host's GPU and TensorRT-LLM).
``lmi-trt plan`` / ``lmi-trt compile`` are ``lmi_trt/cli/plan.py`` and ``compile.py``.
Only the light, pure parts are re-exported here.
"""

from .errors import BuildError, CacheError, PlanError
from .options import CompileOptions
from .plan import BuildPlan, GpuFacts, MemoryEstimate, estimate_memory, make_plan

__all__ = [
    "BuildError",
    "BuildPlan",
    "CacheError",
    "CompileOptions",
    "GpuFacts",
    "MemoryEstimate",
    "PlanError",
    "estimate_memory",
    "make_plan",
]
