"""The fake LLM API and lmi_trt's use of it, checked name by name against ``tests/fakes/llmapi_surface.py``
(data read from TensorRT-LLM's source, parsed with ``ast.literal_eval``), for every release the fake plays.

* every public name the fake defines is listed, in the module the listing names, with the listed
  constructor keywords (order, keyword-only, required, literal defaults), enum members, and no method or
  property the listing lacks;
* ``generate_async`` takes exactly the listed keywords of each release; log probs are top-1 in 1.0.0
  and top-k from 1.1.0; TensorRT-engine keywords are named as such while the release still has them;
* every ``llmapi.*`` name, constructor keyword and planned ``LLM``/``SamplingParams`` keyword that
  ``lmi_trt/engines/llmapi.py`` uses is listed;
* the option mapping (``llm_plan``/``plan_request``) as pure functions.
"""

from __future__ import annotations

import ast
import asyncio
import enum
import functools
import importlib
import inspect
from pathlib import Path

import pytest
from packaging.version import Version
from test_fake_surface import listed_params, load_assignments, sig_names, signature_mismatch
from tinymodels import tiny_model
from trtllm_testing import FAKES, fake_tensorrt_llm

from lmi_trt.config import LmiConfig
from lmi_trt.engines.base import EngineError, GenerationRequest, GuidedDecoding, SamplingParams
from lmi_trt.engines.llmapi import (
    Codec,
    LlmApiSettings,
    llm_api_release,
    llm_plan,
    plan_request,
    prompt_token_logprobs,
    reason_name,
    token_logprobs,
)
from lmi_trt.engines.trtllm import TrtllmSettings
from lmi_trt.stages import llmapi_settings, settle

REPO = Path(__file__).resolve().parents[2]
LISTING = FAKES / "llmapi_surface.py"
_ASSIGNED = load_assignments(LISTING)
SURFACE, RELEASES = _ASSIGNED["SURFACE"], _ASSIGNED["RELEASES"]
API = SURFACE["tensorrt_llm.llmapi"]
FAKE_MODULES = [
    m
    for m in SURFACE["modules"]
    if m not in ("tensorrt_llm", "tensorrt_llm.bindings.executor", "tensorrt_llm._tensorrt_engine")
]


@pytest.fixture(params=RELEASES)
def trt(request):
    with fake_tensorrt_llm(request.param) as module:
        yield module


def defined_public(module_name: str):
    """Public classes/functions a fake module defines (a package: also what it re-exports)."""
    module = importlib.import_module(module_name)
    package = hasattr(module, "__path__")
    for name, obj in vars(module).items():
        if name.startswith("_") or inspect.ismodule(obj) or not (inspect.isclass(obj) or callable(obj)):
            continue
        home = str(getattr(obj, "__module__", ""))
        if home == module_name or (package and home.startswith("tensorrt_llm")):
            yield name, obj


def listed_names(entry: dict) -> set[str]:
    names = set()
    for key in ("methods", "static_methods", "props_ro", "props_rw", "members"):
        names |= set(entry.get(key, []))
    for overload in entry.get("ctor", []):
        names |= {p.name for p in listed_params(overload)}
    return names


def pydantic_mismatch(model, overload: list[str]) -> str | None:
    """None when the model's fields are the listed keywords (in order, required, literal defaults)."""
    listed = [p for p in listed_params(overload) if not p.optional_presence or p.name in model.model_fields]
    fields = list(model.model_fields.items())
    if [p.name for p in listed] != [n for n, _ in fields]:
        return f"fields {[n for n, _ in fields]} != listed {[p.name for p in listed]}"
    for want, (name, info) in zip(listed, fields):
        if want.required != info.is_required():
            return f"{name}: required is {info.is_required()}, listed {want.required}"
        is_literal, value = want.literal_default()
        if is_literal and info.default != value:
            return f"{name}: default {info.default!r} != listed {value!r}"
    return None


def test_fake_names_are_listed_in_their_modules(trt):
    problems = []
    for module_name in FAKE_MODULES:
        exports = set(SURFACE["modules"][module_name]["exports"])
        for name, obj in defined_public(module_name):
            if name not in exports:
                problems.append(f"{module_name}.{name}: not among the module's listed exports")
            if inspect.isclass(obj) and name not in API:
                problems.append(f"{module_name}.{name}: no listing entry")
    assert set(importlib.import_module("tensorrt_llm.llmapi").__all__) <= set(API["__all__"])
    assert trt.LLM is importlib.import_module("tensorrt_llm.llmapi").LLM
    assert trt.SamplingParams is importlib.import_module("tensorrt_llm.sampling_params").SamplingParams
    assert not problems, "\n".join(problems)


def test_constructors_enums_and_attributes_match_the_listing(trt):
    from pydantic import BaseModel

    problems, checked = [], 0
    for module_name in FAKE_MODULES:
        for name, obj in defined_public(module_name):
            if not inspect.isclass(obj) or name not in API:
                continue
            entry = API[name]
            if issubclass(obj, enum.Enum):
                if list(obj.__members__) != entry["members"]:
                    problems.append(f"{name}: members {list(obj.__members__)} != {entry['members']}")
                continue
            if "ctor" in entry:
                checked += 1
                if issubclass(obj, BaseModel):
                    mismatch = pydantic_mismatch(obj, entry["ctor"][0])
                else:
                    mismatch = signature_mismatch(obj, entry["ctor"][0], "keyword-only" in entry.get("notes", ""))
                if mismatch:
                    problems.append(f"{name}: {mismatch}")
            own = {
                n
                for k in obj.__mro__
                if k.__module__.startswith("tensorrt_llm")
                for n in vars(k)
                if not n.startswith("_") or n in ("__aiter__", "__anext__", "__await__", "__enter__", "__exit__")
            }
            own -= set(dir(BaseModel)) if issubclass(obj, BaseModel) else set()
            own -= {"model_config", "model_fields"}
            unlisted = own - listed_names(entry)
            if unlisted:
                problems.append(f"{name}: unlisted {sorted(unlisted)}")
    assert checked >= 9
    assert not problems, "\n".join(problems)


def test_generate_async_takes_the_keywords_of_each_release(trt):
    from tensorrt_llm.llmapi import LLM

    sigs = API["LLM"]["sigs"]["generate_async"]
    release = trt.__version__
    this = sig_names(sigs[API["LLM"]["sigs_by_release"]["generate_async"][release]])
    everything = sig_names(sigs[-1])
    assert [p.name for p in list(inspect.signature(LLM.generate_async).parameters.values())[1:]] == everything
    llm = LLM.__new__(LLM)  # the keyword check runs before anything needs a loaded model
    llm._executor = None
    for name in everything:
        if name in this:
            continue
        with pytest.raises(TypeError, match=name):
            llm.generate_async([1, 2], **{name: "x"})


def test_trt_only_keywords_name_the_tensorrt_engine_llm_while_it_exists(trt):
    from tensorrt_llm.llmapi import LLM

    release = trt.__version__
    expected = (
        "_tensorrt_engine"
        if release in SURFACE["modules"]["tensorrt_llm._tensorrt_engine"]["releases"]
        else "invalid argument: build_config"
    )
    with pytest.raises(ValueError, match=expected):
        LLM(str(tiny_model("llama")), build_config={})
    with pytest.raises(ValueError, match="invalid argument: not_a_field"):
        LLM(str(tiny_model("llama")), not_a_field=1)


async def test_logprobs_are_top1_before_1_2_and_top_k_later(trt):
    """The TorchSampler reports the sampled token's log prob only, rank 1 (handle_logits), until PR 7976 (1.2: PR 7756
    was reverted before the 1.1 cut); whether 1.0/1.1 refuse logprobs > 1 up front was not found in any copy read, so
    the fake takes it and returns the one entry."""
    from tensorrt_llm import LLM, SamplingParams

    top_k_release = trt.__version__ not in ("1.0.0", "1.1.0")
    with LLM(str(tiny_model("llama")), max_batch_size=2) as llm:
        params = SamplingParams(max_tokens=3, logprobs=3, top_k=1)
        result = await asyncio.wait_for(llm.generate_async([1, 45, 67], params), 60)
        out = result.outputs[0]
        assert len(out.logprobs) == len(out.token_ids) == 3 and out.finish_reason == "length"
        for token, entry in zip(out.token_ids, out.logprobs):
            assert token in entry and len(entry) == (3 if top_k_release else 1) and entry[token].rank == 1
            if top_k_release:
                assert [lp.rank for lp in entry.values()] == [1, 2, 3]


def test_sampler_keys_are_each_releases(trt):
    """1.0 has enable_trtllm_sampler/enable_mixed_sampler, 1.1 and later sampler_type (main: not TRTLLMSampler);
    a key the release lacks is an invalid argument, as any unknown key."""
    from tensorrt_llm.llmapi import LLM

    release = trt.__version__
    model = str(tiny_model("llama"))
    for key, releases in API["TorchLlmArgs"]["releases_of"].items():
        value = "auto" if key == "sampler_type" else False
        if release in releases:
            LLM(model, **{key: value}).shutdown()
        else:
            with pytest.raises(ValueError, match=f"invalid argument: {key}"):
                LLM(model, **{key: value})
    if release == "1.3.0":
        with pytest.raises(ValueError, match="TRTLLMSampler"):
            LLM(model, sampler_type="TRTLLMSampler")


@pytest.mark.parametrize("release", ["1.1.0", "1.2.1", "1.3.0"])
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # 1.1: the loop's assert
async def test_the_executor_fails_a_beam_width_other_than_max_as_the_release_does(release):
    """Up to PR 16620 every request must be at max_beam_width: 1.1's executor asserts it in its request loop, which
    ends (NVIDIA/TensorRT-LLM#7368), 1.2's fails that request; main takes a smaller width without log probs."""
    from types import SimpleNamespace

    with fake_tensorrt_llm(release):
        from tensorrt_llm import LLM, SamplingParams
        from tensorrt_llm.executor import RequestError

        # SamplingParams._setup: a kimi_k2 model ends on generation_config.json's one EOS id (PR 7120, from 1.1)
        tokenizer = SimpleNamespace(eos_token_id=2, pad_token_id=0)
        kimi = SimpleNamespace(model_type="kimi_k2")
        params = SamplingParams()._setup(tokenizer, kimi, SimpleNamespace(eos_token_id=7))
        assert params.end_id == 7 and params.pad_id == 0
        assert SamplingParams()._setup(tokenizer, kimi, SimpleNamespace(eos_token_id=[7, 8])).end_id == 2

        # 1.1/1.2: the TRTLLMSampler by name, as lmi-trt asks for it (which one 1.2's 'auto' builds was not read)
        named = {"sampler_type": "TRTLLMSampler"} if release in ("1.1.0", "1.2.1") else {}
        with LLM(str(tiny_model("llama")), max_batch_size=2, max_beam_width=2, **named) as llm:
            plain = llm.generate_async([1, 45, 67], SamplingParams(max_tokens=3))
            if release == "1.1.0":
                llm._executor._thread.join(60)
                assert not llm._executor._thread.is_alive() and isinstance(llm._executor.dead, AssertionError)
                assert "is not equal to max_beam_width 2" in str(llm._executor.dead)
                return
            if release == "1.2.1":
                with pytest.raises(RequestError, match="Request beam width 1 is not equal to max_beam_width 2"):
                    await asyncio.wait_for(plain, 60)
            else:
                assert len((await asyncio.wait_for(plain, 60)).outputs[0].token_ids) == 3
                with pytest.raises(RequestError, match="below max_beam_width"):
                    await asyncio.wait_for(llm.generate_async([1, 45], SamplingParams(max_tokens=3, logprobs=1)), 60)
            params = SamplingParams(max_tokens=3, use_beam_search=True, best_of=2, n=1)
            assert (await asyncio.wait_for(llm.generate_async([1, 45, 67], params), 60)).finished


# ------------------------------------------------------------------------------ lmi_trt ⊆ the listing

ENGINE_FILE = REPO / "lmi_trt" / "engines" / "llmapi.py"
LLM_KEYWORDS = {p.name for p in listed_params(API["LLM"]["ctor"][0])} | {
    p.name for p in listed_params(API["TorchLlmArgs"]["ctor"][0])
}


def ctor_names(name: str) -> set[str]:
    return LLM_KEYWORDS if name == "LLM" else {p.name for p in listed_params(API[name]["ctor"][0])}


def test_the_engine_uses_only_listed_llmapi_names_and_keywords():
    tree = ast.parse(ENGINE_FILE.read_text())
    problems, seen = [], set()
    generate_keywords = {n for sig in API["LLM"]["sigs"]["generate_async"] for n in sig_names(sig)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "llmapi":
            seen.add(node.attr)
            if node.attr not in API["__all__"]:
                problems.append(f"llmapi.{node.attr} is not listed")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            if isinstance(func.value, ast.Name) and func.value.id == "llmapi" and "ctor" in API.get(func.attr, {}):
                problems += [
                    f"llmapi.{func.attr}({k.arg}=)"
                    for k in node.keywords
                    if k.arg and k.arg not in ctor_names(func.attr)
                ]
            if func.attr == "generate_async":
                seen.add("generate_async")
                problems += [f"generate_async({k.arg}=)" for k in node.keywords if k.arg not in generate_keywords]
    assert {"LLM", "SamplingParams", "KvCacheConfig", "RequestError", "generate_async"} <= seen
    assert not problems, "\n".join(problems)


CODEC = Codec(decode=lambda ids: "|".join(map(str, ids)), encode=lambda text: [int(t) for t in text.split("|")])
# plan_request's keywords for an LLM whose tokenizer ends on 2 (SamplingParams._setup's end id)
PLAN = {"eos_token_ids": [2], "end_id": 2, "pad_token_id": 0, "max_beam_width": 1, "seed": 7, "codec": CODEC}


def release_fields(release: str) -> set[str]:
    """The LLM keywords of one release: the listed ones less those another release alone has."""
    only = API["TorchLlmArgs"]["releases_of"]
    return {k for k in LLM_KEYWORDS if release in only.get(k, [release])}


@pytest.mark.parametrize("release", RELEASES)
def test_planned_keywords_are_the_releases_fields(release):
    # with every DJL LLM-API key given (tests/unit/test_djl_keys.py): each lands on a listed field
    djl = dict(
        max_attention_window=(64,),
        sink_token_length=0,
        onboard_blocks=True,
        cross_kv_cache_fraction=0.5,
        secondary_offload_min_priority=30,
        event_buffer_max_size=0,
        kv_cache_dtype="fp8",
        moe_tensor_parallel_size=1,
        moe_expert_parallel_size=1,
        enable_attention_dp=False,
        load_format="auto",
        iter_stats_max_iterations=1,
        request_stats_max_iterations=1,
        attn_backend="TRTLLM",
        moe_backend="CUTLASS",
        enable_overlap_scheduler=False,  # 1.0's beam search on the TRTLLMSampler wants it off
        use_cuda_graph=False,
    )
    config = LmiConfig(
        max_rolling_batch_size=16,
        max_num_tokens=4096,
        max_tokens_in_paged_kv_cache=8192,
        enable_kv_cache_reuse=False,
        batch_scheduler_policy="max_utilization",
        max_beam_width=2,
        **djl,
    )
    plan = llm_plan(llmapi_settings(config), llm_api_release(release))
    assert set(plan.keywords) <= release_fields(release)
    assert set(plan.kv_cache_config) <= ctor_names("KvCacheConfig")
    assert set(plan.scheduler_config) <= ctor_names("SchedulerConfig")
    assert plan.cuda_graph_config is None  # option.use_cuda_graph=false
    assert set(plan.moe_config) == {"backend"} <= ctor_names("MoeConfig")
    assert plan.scheduler_config["capacity_scheduler_policy"] in API["CapacitySchedulerPolicy"]["members"]
    nested = {"kv_cache_config": plan.kv_cache_config, "scheduler_config": plan.scheduler_config}
    nested["moe_config"] = plan.moe_config
    assert set(plan.origins) == set(plan.keywords) | {"cuda_graph_config"} | {
        f"{name}.{k}" for name, values in nested.items() for k in values
    }
    request = GenerationRequest(
        "r",
        [1, 2],
        SamplingParams(do_sample=True, logprobs=True, beam_width=1),
        stop_token_ids=[[5], [6, 7]],
        bad_words_ids=[[8]],
    )
    sampling = plan_request(request, **PLAN)
    assert set(sampling.sampling) <= ctor_names("SamplingParams")


def test_guides_map_onto_guided_decoding_params():
    """Regex and EBNF go as they are; JSON as xgrammar's compact grammar of the schema (json_object: an object)."""
    from xgrammar.testing import _is_grammar_accept_string

    fields = set(API["GuidedDecodingParams"]["props_rw"])
    for guided, key in [
        (GuidedDecoding("regex", "(a|b)+"), "regex"),
        (GuidedDecoding("grammar", 'root ::= "x"'), "grammar"),
        (GuidedDecoding("json_schema", '{"type": "integer"}'), "grammar"),
        (GuidedDecoding("json_object"), "grammar"),
    ]:
        request = GenerationRequest("g", [1], SamplingParams(guided=guided))
        guide = plan_request(request, **PLAN).guide
        assert list(guide) == [key] and key in fields
        if guided.kind == "json_object":  # an object, written one way: no free whitespace
            accepts = functools.partial(_is_grammar_accept_string, guide["grammar"])
            assert accepts('{"a": [1, 2]}') and not accepts('{ "a": [1, 2]}') and not accepts("[1]")
        elif guided.kind == "json_schema":
            assert _is_grammar_accept_string(guide["grammar"], "12") and not _is_grammar_accept_string(
                guide["grammar"], '"a"'
            )
        else:
            assert guide[key] == guided.value
    bad = GenerationRequest("b", [1], SamplingParams(guided=GuidedDecoding("json_schema", "{not json")))
    with pytest.raises(EngineError, match="json schema") as err:
        plan_request(bad, **PLAN)
    assert err.value.code == 400


def test_options_map_onto_llm_keywords():
    config = LmiConfig(
        tensor_parallel_degree=2,
        pipeline_parallel_degree=2,
        dtype="bf16",
        max_num_sequences=64,
        max_num_tokens=2048,
        max_input_len=512,
        max_output_len=256,
        kv_cache_free_gpu_mem_fraction=0.8,
        max_tokens_in_paged_kv_cache=10000,
        enable_kv_cache_reuse=True,
        batch_scheduler_policy="guaranteed_no_evict",
        enable_chunked_context=True,
        trust_remote_code=True,
        max_beam_width=2,
        kv_cache_host_memory_bytes=2**30,
    )
    plan = llm_plan(llmapi_settings(settle(config, "trtllm")), Version("1.3.0"))
    assert plan.keywords == {
        "tensor_parallel_size": 2,
        "pipeline_parallel_size": 2,
        "dtype": "bfloat16",
        "trust_remote_code": True,
        "max_batch_size": 64,
        "max_beam_width": 2,
        "enable_chunked_prefill": True,
        "enable_iter_perf_stats": True,
        "max_num_tokens": 2048,
        "max_input_len": 512,  # max_seq_len: unset, so TensorRT-LLM's (from the checkpoint)
        "guided_decoding_backend": "xgrammar",
    }
    assert plan.kv_cache_config == {
        "enable_block_reuse": True,
        "free_gpu_memory_fraction": 0.8,
        "max_tokens": 10000,
        "host_cache_size": 2**30,
    }
    assert plan.scheduler_config == {"capacity_scheduler_policy": "GUARANTEED_NO_EVICT"}
    assert plan.origins["max_batch_size"] == "option.max_num_sequences"
    assert plan.origins["scheduler_config.capacity_scheduler_policy"] == "option.batch_scheduler_policy"
    assert plan.origins["enable_iter_perf_stats"].startswith("lmi-trt: /metrics")
    # 1.0: the TRTLLMSampler (its TorchSampler is greedy only), which beam search wants without the overlap
    # scheduler and CUDA graphs (1.0's docs); 1.1/1.2 pick it themselves for beams, which run beside both there
    ten = llm_plan(llmapi_settings(settle(config, "trtllm")), Version("1.0.0"))
    assert {k: ten.keywords[k] for k in ("enable_trtllm_sampler", "disable_overlap_scheduler")} == {
        "enable_trtllm_sampler": True,
        "disable_overlap_scheduler": True,
    }
    assert ten.cuda_graph_config is None and ten.origins["cuda_graph_config"].startswith("lmi-trt: beam search")
    # the nested configs are built by llm_configs, never keywords too (LLM() would get them twice)
    assert not set(ten.keywords) & {"kv_cache_config", "scheduler_config", "moe_config", "cuda_graph_config"}
    twelve = llm_plan(llmapi_settings(settle(config, "trtllm")), Version("1.2.1"))
    assert not {"enable_trtllm_sampler", "disable_overlap_scheduler"} & set(twelve.keywords)
    assert "cuda_graph_config" not in twelve.origins
    assert (
        llm_plan(llmapi_settings(settle(config.derived("t", max_seq_len=700), "trtllm")), Version("1.2.1")).origins[
            "max_seq_len"
        ]
        == "option.max_seq_len"
    )
    with pytest.raises(EngineError, match=r"option.max_beam_width=2: .*1\.3\.0rc26"):
        llm_plan(llmapi_settings(settle(config, "trtllm")), Version("1.3.0rc25"))
    # unset options are TensorRT-LLM's: no batch size, no block reuse or scheduler policy (DJL's defaults differ)
    default = llm_plan(llmapi_settings(settle(LmiConfig(), "trtllm")), Version("1.2.1"))
    assert default.kv_cache_config == {} and default.scheduler_config == {}
    assert not {
        "max_batch_size",
        "max_beam_width",
        "enable_chunked_prefill",
        "dtype",
        "cuda_graph_config",
        "max_seq_len",
    } & set(default.keywords)
    ten_default = llm_plan(llmapi_settings(settle(LmiConfig(), "trtllm")), Version("1.0.0"))
    assert (
        ten_default.keywords["enable_trtllm_sampler"] is True
        and "prototype" in ten_default.origins["enable_trtllm_sampler"]
    )
    with pytest.raises(EngineError, match="option.tensor_parallel_degree=max"):
        llm_plan(LlmApiSettings(runtime=TrtllmSettings(tensor_parallel_degree=None)), Version("1.2.1"))


def test_requests_map_onto_sampling_params():
    """As trtllm-serve builds them: no end_id/pad_id, so the LLM's SamplingParams._setup tokenizes stop/bad text;
    further EOS ids are stop tokens."""
    greedy = plan_request(
        GenerationRequest(
            "g",
            [1, 2],
            SamplingParams(max_new_tokens=9, logprobs=True, min_new_tokens=2),
            stop_token_ids=[[5], [6, 7]],
            bad_words_ids=[[8], [9, 10]],
        ),
        **{**PLAN, "eos_token_ids": [3, 2]},  # the LLM's end id (its tokenizer's) need not be lmi-trt's first
    )
    assert greedy.sampling == {
        "top_k": 1,
        "min_tokens": 2,
        "max_tokens": 9,
        "ignore_eos": False,
        "stop_token_ids": [5, 3],
        "stop": ["6|7"],
        "bad_token_ids": [8],
        "bad": ["9|10"],
        "include_stop_str_in_output": True,
        "logprobs": 1,
        "prompt_logprobs": None,
        "detokenize": False,
    }
    assert greedy.end_id == 2 and greedy.extra_eos == frozenset({3}) and greedy.bias == {}
    scored = plan_request(
        GenerationRequest("p", [1, 2], SamplingParams(prompt_logprobs=True, logit_bias=((42, 100.0), (7, -5.0)))),
        **PLAN,
    )
    # the top 1 per prompt position, which from 1.3 also holds the prompt token's (PR 11235)
    assert scored.sampling["prompt_logprobs"] == 1 and scored.bias == {42: 100.0, 7: -5.0}
    hot = SamplingParams(do_sample=True, temperature=0.5, seed=11, repetition_penalty=1.2, ignore_eos=True)
    sampled = plan_request(GenerationRequest("s", [1], hot), **{**PLAN, "eos_token_ids": [2, 3]})
    assert {k: sampled.sampling[k] for k in ("top_k", "top_p", "temperature", "seed", "repetition_penalty")} == {
        "top_k": 0,
        "top_p": 1.0,
        "temperature": 0.5,
        "seed": 11,
        "repetition_penalty": 1.2,  # as given: the core fills DJL's
    }
    assert sampled.sampling["ignore_eos"] and sampled.sampling["stop_token_ids"] is None and sampled.end_id == -1
    # where the release's sampler draws from its own generator, no seed is sent for an unseeded request
    why = {"seed": "TorchSampler's one generator; leave it out"}
    unseeded = plan_request(GenerationRequest("u", [1], SamplingParams(do_sample=True)), **PLAN, unsupported=why)
    assert "seed" not in unseeded.sampling
    with pytest.raises(EngineError, match="TorchSampler's one generator; leave it out") as err:
        plan_request(GenerationRequest("s", [1], hot), **PLAN, unsupported=why)
    assert (err.value.code, err.value.field) == (400, "seed")  # the serving layer names it as the client does
    beam = plan_request(
        GenerationRequest("b", [1], SamplingParams(beam_width=3), streaming=False), **{**PLAN, "max_beam_width": 4}
    )
    assert (beam.sampling["use_beam_search"], beam.sampling["best_of"], beam.sampling["n"]) == (True, 3, 1)
    odd = Codec(decode=lambda ids: "x", encode=lambda text: [99])
    with pytest.raises(EngineError, match="cannot be banned on the pytorch backend") as err:
        plan_request(GenerationRequest("o", [1], SamplingParams(), bad_words_ids=[[4, 5]]), **{**PLAN, "codec": odd})
    assert err.value.code == 400
    # a tokenizer without EOS: no _setup, so the request names its end and no sequence goes as text
    bare = plan_request(
        GenerationRequest("n", [1], SamplingParams(), stop_token_ids=[[6, 7]]), **{**PLAN, "end_id": None}
    )
    assert (bare.sampling["end_id"], bare.sampling["pad_id"], bare.sampling["stop"]) == (2, 0, None)


def test_results_map_back():
    from dataclasses import dataclass

    @dataclass
    class Logprob:
        logprob: float
        rank: int | None = None

    assert token_logprobs([5, 6, 7], [{5: Logprob(-0.5, 1)}, {1: Logprob(-0.1, 1)}, -0.25]) == [-0.5, -9999.0, -0.25]
    # entry t scores the token after position t; the last one (the first generated token) is not the prompt's
    entries = [{6: Logprob(-1.0, 2), 3: Logprob(-0.2, 1)}, {7: Logprob(-0.3, 1)}, {9: Logprob(-0.1, 1)}]
    assert prompt_token_logprobs([5, 6, 7], entries) == [None, -1.0, -0.3]
    assert reason_name("stop", None) == "END_ID" and reason_name("stop", 7) == "STOP_WORDS"
    assert reason_name("stop", "</s>") == "STOP_WORDS" and reason_name("length", None) == "LENGTH"
    assert reason_name("cancelled", None) == "CANCELLED" and reason_name("timeout", None) == "TIMED_OUT"
    assert reason_name(None, None) == "NOT_FINISHED"
