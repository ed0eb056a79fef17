"""Differences between the transformers releases lmi-trt runs with.

The TensorRT-LLM release images pin transformers 4.42.4 (0.12), 4.53.1 (1.0), 4.56.0 (1.1) and 4.57.3 (1.2)
(ci/pins/); a plain install gets today's. Code that calls an API whose spelling changed across that range
goes through here.
"""

from __future__ import annotations

from typing import Any

import transformers
from packaging.version import Version

# ``from_pretrained(dtype=...)`` exists from transformers 4.56 on (modeling_utils pops "dtype" and warns that
# "`torch_dtype` is deprecated"); 4.42–4.53 pass an unknown ``dtype`` on to the model's __init__, a TypeError.
_DTYPE_KEYWORD = "dtype" if Version(transformers.__version__).release >= (4, 56) else "torch_dtype"


# transformers 5.24 renamed the forward pass's ``past_key_values`` (the argument and the output's field) to
# ``cache`` and warns at the old name (transformers/utils/generic.py: "`past_key_values`/`cache_params` are
# deprecated. Use `cache` instead."); 5.23 and earlier (every release image's) know only the old name.
_CACHE_NAME = "cache" if Version(transformers.__version__).release >= (5, 24) else "past_key_values"


def cache_kwargs(cache: Any) -> dict[str, Any]:
    """The forward pass's keyword for the KV cache to continue from, spelled as this transformers expects."""
    return {_CACHE_NAME: cache}


def returned_cache(out: Any) -> Any:
    """The KV cache a forward pass returned (its output's field, named as this transformers names it)."""
    return getattr(out, _CACHE_NAME)


def dtype_kwargs(dtype: Any) -> dict[str, Any]:
    """The ``from_pretrained`` keyword for the weights' dtype, spelled as this transformers expects."""
    return {_DTYPE_KEYWORD: dtype}


def text_config(config: Any) -> Any:
    """The language model's part of a (possibly multimodal) config; ``get_text_config`` is absent in 4.42."""
    get = getattr(config, "get_text_config", None)
    return get() if get is not None else config


def reorder_cache(cache: Any, index: Any) -> Any:
    """Keep the KV-cache rows ``index`` (a tensor of batch indices); returns the cache to use next.

    transformers returns a ``Cache`` object (``reorder_cache`` in place) where the model supports one, and
    the legacy tuple of per-layer (key, value) tensors, batch first, otherwise: 4.42 does so for every model
    called without a cache object, and for GPT-2, Falcon and GPT-J always.
    """
    if hasattr(cache, "reorder_cache"):
        cache.reorder_cache(index)
        return cache
    return tuple(tuple(t.index_select(0, index) for t in layer) for layer in cache)
