"""Which TensorRT-LLM release the fake impersonates (private to the fake).

The release comes from the environment variable ``LMI_TRT_FAKE_RELEASE`` (one of ``RELEASES``, or a release
candidate of the line after 1.2: ``1.3.0rc4``), read once at import, so server processes started by tests
impersonate the same release as the test. Versions compare as PEP 440 versions (``at_least``), so ``1.3.0rc4`` is
below ``1.3.0rc25`` and both below ``1.3.0``: the fake's behaviour per release candidate follows the first candidate
each fix is verified in (``_llm_runtime``).
Unset, the fake is 1.0.0: the release ``docker/Dockerfile``'s base image ships, so the default run
exercises the shipped image's API. Tests may switch it in-process with
``tensorrt_llm.__version__ = "0.12.0"``; listeners (the executor bindings, ``PluginConfig``,
``BuildConfig``, ``ExtendedRuntimePerfKnobConfig``) then rebind the names whose shape differs.
"""

from __future__ import annotations

import os
import re

from packaging.version import InvalidVersion, Version

# 1.3.0: the release after 1.2, without the TensorRT-engine Executor (NVIDIA/TensorRT-LLM PRs 15918 and 16369):
# the LLM API's PyTorch backend only; the fake's 1.3.0 is main as of 2026-09 (1.3.0rc27 and later: PR 18513, merged
# 2026-09-03, after the 1.3.0rc26 version bump of 2026-08-31). The 1.3.0 release candidates before it ship for months
# (RC_PATTERN), each holding a different part of main's sampler fixes.
RELEASES = ("0.12.0", "1.0.0", "1.1.0", "1.2.1", "1.3.0")
RC_PATTERN = re.compile(r"^1\.3\.0rc\d+$")
ENV = "LMI_TRT_FAKE_RELEASE"
DEFAULT_VERSION = "1.0.0"


def _from_environment() -> str:
    value = os.environ.get(ENV, "").strip()
    if not value:
        return DEFAULT_VERSION
    if value not in RELEASES and not RC_PATTERN.match(value):
        raise ValueError(f"fake tensorrt_llm: {ENV}={value!r} is not one of {', '.join(RELEASES)}, nor 1.3.0rcN")
    return value


_version = _from_environment()
_listeners: list = []


def version() -> str:
    return _version


def series(v: str | None = None) -> tuple[int, int]:
    m = re.match(r"^(\d+)\.(\d+)", v or _version)
    if not m:
        raise ValueError(f"fake tensorrt_llm: cannot parse version {v!r}")
    return int(m.group(1)), int(m.group(2))


def at_least(first: str, v: str | None = None) -> bool:
    """Whether the release played (or ``v``) is ``first`` or later, as PEP 440 orders them (1.3.0rc4 < 1.3.0rc25 <
    1.3.0)."""
    try:
        return Version(v or _version) >= Version(first)
    except InvalidVersion as exc:
        raise ValueError(f"fake tensorrt_llm: cannot parse version {v or _version!r}") from exc


# The first 1.3.0 release candidate verified to hold each of main's TorchSampler fixes. A fix merged on main before
# the "Bump version to 1.3.0rcN" commit is in rcN (the candidate is tagged at or after its bump); dates from main's
# commit log and the weekly change reports. An earlier candidate may hold it too; the fake plays the verified bound.
FIXES = {
    # PR 12166 (2026-03-16): min_tokens counts generated tokens; rc9 bump 2026-03-18/19 (the rc8 bump was 03-10)
    "min_tokens_on_generated": "1.3.0rc9",
    # PR 12358 ("Fix wrong token suppressed with ignore_eos in Torch sampler"): v1.3.0rc11's release notes
    "ignore_eos_min_tokens": "1.3.0rc11",
    # PR 11235 (2026-03-04, before the rc8 bump): each prompt entry holds a prompt token, the wrong one
    "prompt_token_entry": "1.3.0rc8",
    # PR 12499 (v1.3.0rc11's release notes): ... the right one
    "prompt_token_entry_fixed": "1.3.0rc11",
    # PR 16052 (2026-07-20): bad words; rc23 bump 2026-07-22
    "bad_words": "1.3.0rc23",
    # PR 16485 (2026-07-30): penalties; the rc24 bump is dated 2026-07-31 (probably in rc24), the rc25 bump 08-11
    "penalties": "1.3.0rc25",
    # PR 17172 (2026-08-04): per-request seed; rc25 bump 2026-08-11
    "seed": "1.3.0rc25",
    # PR 18232 (2026-08-29): TorchSampler only, sampler_type removed; PR 16620 (2026-08-12): beam widths below
    # max_beam_width; rc26 bump 2026-08-31
    "torch_only": "1.3.0rc26",
    # PR 18513 (2026-09-03): sampler_type accepted again (auto/TorchSampler, ignored); after the rc26 bump
    "sampler_type_again": "1.3.0rc27",
    # PR 14745 (opened 2026-05-29, reviewed 2026-06-03): allow_advanced_sampling a deprecated no-op, the one-model
    # speculative paths sample per request. Not pinned to a candidate: only the fake's 1.3.0 (main) holds it, and
    # the engine probes the field's status, so a candidate that took it earlier is served right too
    "advanced_sampling_auto": "1.3.0",
    # PR 12341 ("decouple MTP num_nextn_predict_layers from max_draft_len", description 2026-03-19; merge date not
    # read): max_draft_len the user-facing field. Not pinned to a candidate: only the fake's 1.3.0 (main) holds it;
    # before it MTPDecodingConfig copies num_nextn_predict_layers (default 1) into max_draft_len (PR 12063,
    # 2026-03-11: "the validator already copies num_nextn_predict_layers into max_draft_len")
    "mtp_max_draft_len": "1.3.0",
}


def has(fix: str) -> bool:
    """Whether the release played holds one of main's fixes (``FIXES``); every 1.2 and earlier release lacks them."""
    return series() >= (1, 3) and at_least(FIXES[fix])


def is_0x() -> bool:
    return series()[0] == 0


def set_version(v: str) -> None:
    """Any parseable version is accepted: 0.x gets the 0.12 shapes, 1.x and later the 1.x ones (1.2 and
    later the pydantic ``PluginConfig``), so callers can also be tested against releases they must refuse."""
    global _version
    series(v)
    _version = v
    for listener in _listeners:
        listener(v)


def on_change(listener) -> None:
    """Register a callback run (now and) whenever the version changes."""
    _listeners.append(listener)
    listener(_version)
