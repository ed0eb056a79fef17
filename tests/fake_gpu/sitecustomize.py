"""The one hardware seam for serving the fake TensorRT-LLM (tests/fakes) on a machine without a GPU.

Python imports ``sitecustomize`` at start-up from the first folder on its path that has one: with this folder on
PYTHONPATH (before tests/fakes), every lmi-trt process of a job, MPI ranks and notebook servers included, takes
the GPU check as passed, and the fake Executor runs on the CPU. The tests and the notebooks' local mode use it.
"""

import lmi_trt.engines.trtllm as _trt

_trt.cuda_available = lambda: True
