"""Protocol adapters: thin schema translations onto the one request core (``serving.core``).

``DEFAULT_ADAPTERS`` is every schema this server speaks, in install order; the order also fixes
how ``POST /invocations`` picks a schema for a JSON object (first match wins):
``inputs`` → LMI, ``messages`` → OpenAI chat, ``prompt`` → Truss (or OpenAI completions when the
body is completions-shaped, see ``truss``). Other routes are schema-specific: ``/v1/*`` OpenAI,
``/generate``, ``/generate_stream``, ``/``, ``/info``, ``/health`` TGI, ``/v2/models/...`` Triton,
``/endpoints/{name}/invocations[-response-stream]`` the SageMaker runtime emulation,
``/models/{model}/adapters``, ``/adapters`` and ``/v1/(un)load_lora_adapter`` the LoRA adapters
(``lora``, with option.enable_lora), ``/v1/capabilities`` what the engine honours (``lmi_trt.serving.capabilities``),
``/openapi.json`` the OpenAPI description of all of them.
"""

from __future__ import annotations

from lmi_trt.serving import capabilities, openapi
from lmi_trt.serving.protocols import lmi, lora, openai, sagemaker, tgi, triton, truss

# capabilities after the schemas (it shows the fields they registered); openapi last: it describes the
# routes the others installed (GET /openapi.json).
DEFAULT_ADAPTERS = (
    lmi.install,
    openai.install,
    tgi.install,
    triton.install,
    truss.install,
    sagemaker.install,
    lora.install,
    capabilities.install,
    openapi.install,
)

__all__ = ["DEFAULT_ADAPTERS"]
