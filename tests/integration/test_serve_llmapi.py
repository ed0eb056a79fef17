"""`lmi-trt serve` as a process on TensorRT-LLM's PyTorch backend (the fake LLM API, which really generates
with the tiny Llama): the Executor path's HTTP checks, and option.backend=auto per release."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
import requests
from cliserver import serve
from s3server import s3_server  # noqa: F401 — a pytest fixture
from tinymodels import tiny_model, with_eos
from trtllm_testing import FAKES, fake_tensorrt_llm, make_engine_dir

from lmi_trt.compat import dtype_kwargs

pytestmark = pytest.mark.slow

# The one hardware seam, in the server process: no GPU here, the fake needs none.
SITECUSTOMIZE = """\
import lmi_trt.engines.trtllm as _trt
_trt.cuda_available = lambda: True
"""
LIMITS = ["-o", "option.max_input_len=64", "-o", "option.max_output_len=32", "-o", "option.max_rolling_batch_size=4"]
PROMPTS = ["The quick brown fox", "Serving engines batch", "Grüße aus München", "Once upon a time"]


@pytest.fixture(scope="module")
def hf_dir() -> Path:
    return tiny_model("llama")


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("site")
    (d / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return d


def _env(site_dir: Path, version: str) -> dict[str, str]:
    path = os.pathsep.join([str(site_dir), str(FAKES), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {"PYTHONPATH": path, "LMI_TRT_FAKE_RELEASE": version}  # the release the fake impersonates


@pytest.fixture(scope="module")
def reference(hf_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, **dtype_kwargs(torch.float32)).eval()

    def generate(prompt: str, n: int, k: int = 1) -> tuple[list[int], list[float], list[list[float]]]:
        """Greedy tokens, their log probs and the k best log probs per step."""
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(
                ids,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
            )
        tokens = out.sequences[0, ids.shape[1] :].tolist()
        # the raw logits: min_new_tokens masks EOS in the processed scores, which shifts their log_softmax
        steps = [torch.log_softmax(s[0].float(), -1) for s in out.logits]
        return tokens, [lp[t].item() for lp, t in zip(steps, tokens)], [lp.topk(k).values.tolist() for lp in steps]

    return generate


@pytest.fixture(scope="module")
def pytorch_server(hf_dir, site_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    # fp32 as the reference runs, so log probs compare closely
    with serve(
        [
            "--model-id",
            str(hf_dir),
            "--engine",
            "trtllm",
            *LIMITS,
            "-o",
            "option.dtype=fp32",
            "-o",
            f"download_dir={tmp / 'dl'}",
        ],
        tmp,
        env=_env(site_dir, "1.2.1"),
    ) as server:
        yield server


def _details(server, prompt: str, n: int, **extra) -> requests.Response:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": n, "details": True, "ignore_eos": True, **extra}}
    return server.post("/invocations", body)


def test_auto_serves_a_checkpoint_on_12_through_the_pytorch_backend(pytorch_server):
    log = pytorch_server.log()
    assert "TensorRT-LLM backend: pytorch (auto: a Hugging Face checkpoint on TensorRT-LLM 1.2.1" in log, log[-3000:]
    assert "pytorch backend" in log and "compile:" not in log  # no trtllm-build on this path


def test_greedy_tokens_equal_generate_streams_reassemble_and_errors_stay_per_request(pytorch_server, reference):
    from concurrent.futures import ThreadPoolExecutor

    def one(prompt: str) -> list[int]:
        r = _details(pytorch_server, prompt, 10)
        assert r.status_code == 200, r.text
        return [t["id"] for t in r.json()["details"]["tokens"]]

    def stream(prompt: str) -> list[int]:
        body = {"inputs": prompt, "parameters": {"max_new_tokens": 10, "ignore_eos": True}, "stream": True}
        with requests.post(pytorch_server.url + "/invocations", json=body, stream=True, timeout=60) as r:
            assert r.status_code == 200, r.text
            return [json.loads(line)["token"]["id"] for line in r.iter_lines() if line.strip()]

    def too_long() -> requests.Response:
        return pytorch_server.post("/invocations", {"inputs": "word " * 200, "parameters": {"max_new_tokens": 4}})

    with ThreadPoolExecutor(9) as pool:
        singles = [pool.submit(one, p) for p in PROMPTS]
        streams = [pool.submit(stream, p) for p in PROMPTS]
        bad = pool.submit(too_long)
        for prompt, single, streamed in zip(PROMPTS, singles, streams):
            expected = reference(prompt, 10)[0]
            assert single.result() == expected, prompt
            assert streamed.result() == expected, prompt
        assert bad.result().status_code == 400 and "option.max_input_len" in bad.result().text


def test_openai_logprobs_and_top_logprobs_are_the_models(pytorch_server, reference):
    body = {
        "model": "llama",
        "prompt": "Once upon a time",
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": 3,
        "ignore_eos": True,
    }
    r = pytorch_server.post("/v1/completions", body)
    assert r.status_code == 200, r.text
    logprobs = r.json()["choices"][0]["logprobs"]
    _, chosen, expected = reference("Once upon a time", 4, 3)
    assert logprobs["token_logprobs"] == pytest.approx(chosen, abs=1e-3)
    tops = logprobs["top_logprobs"]
    assert len(tops) == 4
    for got, want in zip(tops, expected):
        # keyed by text: alternatives that decode alike (the tiny model's byte pieces) share one key
        assert got and all(any(abs(v - w) < 1e-3 for w in want) for v in got.values()), (got, want)
    chat = {
        "model": "llama",
        "messages": [{"role": "user", "content": "Once upon a time"}],
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
    }
    r = pytorch_server.post("/v1/chat/completions", chat)
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert content and all(len(t["top_logprobs"]) == 3 for t in content)
    for t in content:
        values = [a["logprob"] for a in t["top_logprobs"]]
        assert values == sorted(values, reverse=True) and values[0] == pytest.approx(t["logprob"], abs=1e-5)


def test_disconnect_frees_the_slot(pytorch_server):
    body = {"inputs": "Once upon a time", "parameters": {"max_new_tokens": 32, "ignore_eos": True}, "stream": True}
    with requests.post(pytorch_server.url + "/invocations", json=body, stream=True, timeout=60) as r:
        next(r.iter_lines())  # one token, then hang up
    deadline = time.monotonic() + 60  # a bound on a condition, not a speed
    while True:
        metrics = pytorch_server.get("/metrics").text
        active = [line for line in metrics.splitlines() if line.startswith("lmi_engine_active_requests ")]
        if active and float(active[0].split()[-1]) == 0:
            break
        assert time.monotonic() < deadline, metrics
        time.sleep(0.1)
    assert _details(pytorch_server, "The quick brown fox", 4).status_code == 200


def test_iteration_stats_reach_metrics(pytorch_server):
    assert _details(pytorch_server, "The quick brown fox", 4).status_code == 200
    deadline = time.monotonic() + 60  # the stats poll reads them in the background
    while "lmi_kv_cache_usage_perc{" not in (metrics := pytorch_server.get("/metrics").text):
        assert time.monotonic() < deadline, metrics
        time.sleep(0.2)
    assert 'lmi_kv_cache_usage_perc{model_name="' in metrics and "lmi_engine_executor_active_requests " in metrics


# ------------------------------------------------------------------ every sampling field, per release

# What each release's sampler does with the fields its samplers differ on (the fake cites the sources,
# tests/fakes/tensorrt_llm/_llm_runtime.py): 1.0 is served by its TRTLLMSampler (the C++ decoder), 1.1 and 1.2 by the
# TorchSampler, which ignores penalties, a request's seed and bad words and counts the prompt into min_tokens, and
# main's TorchSampler honours them all; the 1.3.0 release candidates gain them one by one (1.3.0rc24: min_tokens,
# prompt log probs and bad words, not yet the seed and the penalties). log probs: 1.0 and 1.1 give the chosen token's
# only; logit_bias: from 1.1.
RELEASES = ("1.0.0", "1.1.0", "1.2.1", "1.3.0rc24", "1.3.0")
REFUSING = ("1.1.0", "1.2.1")
NO_SEED_OR_PENALTIES = (*REFUSING, "1.3.0rc24")
SAMPLING_PROMPT = "The quick brown fox"


@pytest.fixture(scope="module", params=RELEASES)
def release_server(request, hf_dir, site_dir, tmp_path_factory, reference):
    """A server per release, on a copy of the tiny model whose EOS is the first token it writes for
    SAMPLING_PROMPT: a request ends at once unless it ignores EOS, holds it back or biases it away."""
    release = request.param
    first = reference(SAMPLING_PROMPT, 1)[0][0]
    tmp = tmp_path_factory.mktemp(f"serve-{release}")
    model = with_eos(hf_dir, first, tmp / "llama")
    with serve(["--model-id", str(model), "--engine", "trtllm", *LIMITS], tmp, env=_env(site_dir, release)) as server:
        yield release, first, server


def test_every_sampling_field_is_honoured_or_refused_per_release(release_server):
    release, eos, server = release_server

    def complete(**fields) -> requests.Response:
        body = {"model": "llama", "prompt": SAMPLING_PROMPT, "max_tokens": 12, **fields}
        return server.post("/v1/completions", body)

    def out(r: requests.Response) -> tuple[str, int]:
        """The text and how many tokens it took."""
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"], r.json()["usage"]["completion_tokens"]

    def refused(r: requests.Response, field: str) -> bool:
        return r.status_code == 400 and field in r.text and release in r.text

    assert out(complete(temperature=0)) == ("", 0)  # the model's first token is its EOS
    greedy = out(complete(temperature=0, ignore_eos=True))
    assert greedy[1] == 12
    # sampling: temperature samples; top_k 1 and a tiny top_p leave only the best token
    assert out(complete(temperature=2.0, ignore_eos=True)) != greedy
    assert out(complete(temperature=2.0, top_k=1, ignore_eos=True)) == greedy
    assert out(complete(temperature=2.0, top_p=0.001, ignore_eos=True)) == greedy
    hot = {"temperature": 2.0, "ignore_eos": True}
    if release in NO_SEED_OR_PENALTIES:
        assert refused(complete(seed=5, **hot), "seed"), release
    else:
        assert out(complete(seed=5, **hot)) == out(complete(seed=5, **hot)) != out(complete(seed=6, **hot))
    for field, value in (("repetition_penalty", 3.0), ("presence_penalty", 2.0), ("frequency_penalty", 2.0)):
        r = complete(temperature=0, ignore_eos=True, **{field: value})
        assert refused(r, field) if release in NO_SEED_OR_PENALTIES else out(r) != greedy, (field, r.text)
    word = greedy[0].split()[0]
    r = complete(temperature=0, ignore_eos=True, bad_words=[word])
    assert refused(r, "bad_words") if release in REFUSING else word not in out(r)[0], r.text
    r = complete(temperature=0, min_tokens=4)
    assert refused(r, "min_tokens") if release in REFUSING else out(r)[1] >= 4, r.text
    r = complete(temperature=0, ignore_eos=True, stop_token_ids=[eos])  # the EOS token, written first, stops it
    stops = release in ("1.0.0", "1.1.0")  # main drops stop words under ignore_eos; 1.2 was not read
    assert out(r)[1] == 1 if stops else refused(r, "stop_token_ids"), r.text
    r = complete(temperature=0, logit_bias={str(eos): -100})
    assert refused(r, "logit_bias") if release == "1.0.0" else out(r)[1] == 12, r.text
    r = complete(temperature=0, ignore_eos=True, logprobs=2)
    if release in ("1.0.0", "1.1.0"):  # top k from PR 7976 (1.2): PR 7756 was reverted before the 1.1 cut
        assert refused(r, "logprobs"), r.text
    else:
        assert len(r.json()["choices"][0]["logprobs"]["top_logprobs"][0]) == 2, r.text
    r = complete(temperature=0, ignore_eos=True, echo=True, logprobs=0, max_tokens=1)
    assert refused(r, "echo") if release in ("1.0.0", *REFUSING) else r.status_code == 200, r.text
    # the same refusals under the LMI schema's names
    lmi = server.post("/invocations", {"inputs": SAMPLING_PROMPT, "parameters": {"repetition_penalty": 2.0}})
    expected = (
        refused(lmi, "parameters.repetition_penalty") if release in NO_SEED_OR_PENALTIES else lmi.status_code == 200
    )
    assert expected, lmi.text


def test_the_sequence_limit_is_the_releases_so_nothing_is_cut_silently(hf_dir, site_dir, tmp_path):
    """No option.max_seq_len: the LLM gets none and TensorRT-LLM takes the checkpoint's 512 positions; a request
    whose prompt + max_tokens does not fit is a 400 naming that limit, where the worker would cut max_tokens silently
    (executor/base_worker.py _deduce_max_tokens)."""
    limits = [
        "-o",
        "option.max_input_len=480",
        "-o",
        "option.max_output_len=100",
        "-o",
        "option.max_rolling_batch_size=2",
    ]
    with serve(
        ["--model-id", str(hf_dir), "--engine", "trtllm", *limits], tmp_path, env=_env(site_dir, "1.2.1")
    ) as server:
        assert "max_seq_len=512 (an estimate from the checkpoint" in server.log(), server.log()[-3000:]
        prompt = list(range(5, 455))  # 450 token ids
        body = {"model": "llama", "prompt": prompt, "max_tokens": 100, "temperature": 0}
        r = server.post("/v1/completions", body)
        assert r.status_code == 400 and "max_seq_len=512" in r.text and "at most 62" in r.text, r.text
        r = server.post("/v1/completions", {**body, "max_tokens": 62, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 62, r.text


# ------------------------------------------------------------------ option.backend=auto per release


@pytest.fixture(scope="module")
def engine_dir(hf_dir, tmp_path_factory):
    with fake_tensorrt_llm():
        return make_engine_dir(
            hf_dir, tmp_path_factory.mktemp("engine") / "engine", max_batch_size=4, max_input_len=64, max_seq_len=96
        )


@pytest.mark.parametrize(
    "version,artifact,expected",
    [
        ("0.12.0", "engine", "TensorRT-LLM backend: tensorrt (auto: a precompiled TensorRT engine folder"),
        ("1.2.1", "engine", "TensorRT-LLM backend: tensorrt (auto: a precompiled TensorRT engine folder"),
        (
            "1.3.0",
            "checkpoint",
            "TensorRT-LLM backend: pytorch (auto: TensorRT-LLM 1.3.0 has no TensorRT-engine Executor",
        ),
    ],
)
def test_auto_picks_per_release(version, artifact, expected, hf_dir, site_dir, tmp_path):
    if artifact == "engine":
        with fake_tensorrt_llm(version):  # engines load only in the release that built them
            built = make_engine_dir(hf_dir, tmp_path / "engine", max_batch_size=4, max_input_len=64, max_seq_len=96)
        args = ["--model-id", str(built), "-o", f"option.tokenizer_id={hf_dir}"]
    else:
        args = ["--model-id", str(hf_dir)]
    with serve(
        [*args, "--engine", "trtllm", *LIMITS, "-o", f"download_dir={tmp_path / 'dl'}"],
        tmp_path,
        env=_env(site_dir, version),
    ) as server:
        assert expected in server.log(), server.log()[-3000:]
        assert _details(server, "The quick brown fox", 4).status_code == 200


@pytest.mark.parametrize(
    "version,args_of,problem",
    [
        ("1.3.0", "engine", "needs the TensorRT-engine Executor, and TensorRT-LLM 1.3.0 has none"),
        ("1.3.0", "tensorrt", "needs the TensorRT-engine Executor, and TensorRT-LLM 1.3.0 has none"),
        ("0.12.0", "pytorch", "TensorRT-LLM 0.12.0 has no PyTorch LLM API"),
    ],
)
def test_a_combination_the_release_cannot_serve_is_a_startup_error(
    version, args_of, problem, hf_dir, engine_dir, site_dir, tmp_path
):
    args = {
        "engine": ["--model-id", str(engine_dir), "-o", f"option.tokenizer_id={hf_dir}"],
        "tensorrt": ["--model-id", str(hf_dir), "-o", "option.backend=tensorrt"],
        "pytorch": ["--model-id", str(hf_dir), "-o", "option.backend=pytorch"],
    }[args_of]
    with serve([*args, "--engine", "trtllm", *LIMITS], tmp_path, env=_env(site_dir, version), ready=False) as server:
        assert server.proc.wait(timeout=120) == 2
        log = server.log()
        assert "option.backend=" in log and problem in log, log[-3000:]


def test_what_10_lacks_is_refused_naming_the_field(hf_dir, site_dir, tmp_path):
    """1.0's PyTorch backend returns the sampled token's log prob only (PR 7756 added top k in 1.1), and its
    sampler adds no embedding bias (PR 6464, in 1.1)."""
    with serve(
        ["--model-id", str(hf_dir), "--engine", "trtllm", *LIMITS], tmp_path, env=_env(site_dir, "1.0.0")
    ) as server:
        body = {"model": "llama", "prompt": "Once upon a time", "max_tokens": 4, "logprobs": 2}
        r = server.post("/v1/completions", body)
        assert r.status_code == 400 and "logprobs=2" in r.text, r.text
        assert server.post("/v1/completions", {**body, "logprobs": 0}).status_code == 200
        r = server.post("/v1/completions", {**body, "logprobs": 0, "logit_bias": {"42": 100}})
        assert r.status_code == 400 and "logit_bias" in r.text and "TensorRT-LLM 1.0.0" in r.text, r.text


def test_logit_bias_moves_the_choice_and_prompt_log_probs_before_13_are_refused(pytorch_server, reference):
    """1.2: logit_bias through SamplingParams.embedding_bias; prompt log probs are refused, since 1.1–1.2 report
    only the top k of each prompt position, which can leave the prompt token out (PR 11235 fixed it in 1.3)."""

    # Plain HTTP: the release legs install .[test-core], which has no openai client.
    def complete(max_tokens: int, **fields) -> dict:
        body = {"model": "llama", "prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0}
        r = pytorch_server.post("/v1/completions", {**body, "logprobs": 0, **fields})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]

    first = reference("Once upon a time", 1)[0][0]
    pushed = complete(4, logit_bias={"42": 100})
    away = complete(1, logit_bias={str(first): -100})
    plain = complete(1)
    assert len(set(pushed["logprobs"]["tokens"])) == 1 and away["text"] != plain["text"]
    r = pytorch_server.post("/generate", {"inputs": "Hi", "parameters": {"decoder_input_details": True}})
    assert r.status_code == 400 and "parameters.decoder_input_details" in r.text and "TensorRT-LLM 1.2.1" in r.text
    r = pytorch_server.post("/v1/completions", {"prompt": "Hi", "echo": True, "logprobs": 0, "max_tokens": 1})
    assert r.status_code == 400 and "echo" in r.text, r.text


def test_prompt_log_probs_on_13_equal_log_softmax_of_the_logits(hf_dir, site_dir, tmp_path, hf_online):
    """TGI decoder_input_details (huggingface_hub's client) and OpenAI echo + logprobs on the release after 1.2."""
    import torch
    from huggingface_hub import InferenceClient
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompt = "Once upon a time"
    ids = AutoTokenizer.from_pretrained(hf_dir)(prompt).input_ids
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    want = logits.log_softmax(-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()
    with serve(
        ["--model-id", str(hf_dir), "--engine", "trtllm", *LIMITS, "-o", "option.dtype=fp32"],
        tmp_path,
        env=_env(site_dir, "1.3.0"),
    ) as server:
        out = InferenceClient(model=server.url).text_generation(
            prompt, max_new_tokens=2, details=True, decoder_input_details=True
        )
        prefill = out.details.prefill
        assert [t.id for t in prefill] == ids and prefill[0].logprob is None
        assert [t.logprob for t in prefill[1:]] == pytest.approx(want, abs=1e-3)
        r = server.post("/v1/completions", {"prompt": prompt, "echo": True, "logprobs": 0, "max_tokens": 2})
        assert r.status_code == 200, r.text
        token_logprobs = r.json()["choices"][0]["logprobs"]["token_logprobs"]
        assert token_logprobs[0] is None and token_logprobs[1 : len(ids)] == pytest.approx(want, abs=1e-3)


# --- constrained decoding on the PyTorch backend (guided_decoding_backend="xgrammar") ---
SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
    "required": ["color", "ok"],
    "additionalProperties": False,
}


def test_openai_json_schema_and_tgi_regex_are_guided(pytorch_server):
    """The tiny model is random: only the backend's grammar makes these outputs what was asked for."""
    import jsonschema

    fmt = {"type": "json_schema", "json_schema": {"name": "pick", "schema": SCHEMA}}
    for sampling in ({}, {"seed": 1, "temperature": 1.0}, {"seed": 2, "temperature": 1.0}):
        r = pytorch_server.post(
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Pick."}], "max_tokens": 32, "response_format": fmt, **sampling},
        )
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop", r.text
        jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
    r = pytorch_server.post(
        "/generate",
        {
            "inputs": "Answer",
            "parameters": {"max_new_tokens": 8, "grammar": {"type": "regex", "value": "(yes|no)[0-9]{2}"}},
        },
    )
    assert re.fullmatch("(yes|no)[0-9]{2}", r.json()["generated_text"]), r.text


def test_a_guide_the_backend_cannot_compile_fails_that_request_only(pytorch_server):
    bad = pytorch_server.post("/invocations", {"inputs": "Hi", "parameters": {"guided_regex": "(unclosed"}})
    assert 400 <= bad.status_code < 500, bad.text
    good = _details(pytorch_server, PROMPTS[0], 4)
    assert good.status_code == 200 and len(good.json()["details"]["tokens"]) == 4


# --- option.quantize on the PyTorch backend: modelopt calibration into a unified HF checkpoint, cached ---
def test_quantize_calibrates_once_and_a_second_replica_downloads_it(hf_dir, site_dir, tmp_path, s3_server):  # noqa: F811
    calib = tmp_path / "calib.txt"
    calib.write_text("\n".join(PROMPTS * 4))
    cache = f"s3://{s3_server.new_bucket('engines')}/cache"
    args = [
        "--model-id",
        str(hf_dir),
        "--engine",
        "trtllm",
        *LIMITS,
        "-o",
        "option.quantize=fp8",
        "-o",
        f"option.calib_dataset={calib}",
        "-o",
        "option.calib_size=8",
        "-o",
        f"option.engine_cache_uri={cache}",
    ]
    env = {**_env(site_dir, "1.2.1"), **s3_server.env}
    tokens, logs, served = [], [], []
    for n in (1, 2):  # two replicas: their own download_dir, one engine cache
        replica = tmp_path / f"replica{n}"
        replica.mkdir()
        with serve([*args, "-o", f"download_dir={replica / 'dl'}"], replica, env=env) as server:
            r = _details(server, PROMPTS[0], 6)
            assert r.status_code == 200, r.text
            tokens.append([t["id"] for t in r.json()["details"]["tokens"]])
            logs.append(server.log())
        served += list((replica / "dl").rglob("hf_quant_config.json"))
    assert "calibration batch" in logs[0] and "uploading" in logs[0], logs[0][-3000:]
    assert "downloading" in logs[1] and "calibration" not in logs[1], logs[1][-3000:]
    assert tokens[0] == tokens[1]
    assert [json.loads(f.read_text())["quantization"]["quant_algo"] for f in served] == ["FP8", "FP8"]
    # The calibrated checkpoint is a pre-quantized model: served as it is, and refused a second quantization.
    with serve(
        ["--model-id", str(served[0].parent), "--engine", "trtllm", *LIMITS], tmp_path, env=_env(site_dir, "1.2.1")
    ) as server:
        r = _details(server, PROMPTS[0], 6)
        assert r.status_code == 200 and [t["id"] for t in r.json()["details"]["tokens"]] == tokens[0], r.text
    with serve(
        ["--model-id", str(served[0].parent), "--engine", "trtllm", *LIMITS, "-o", "option.quantize=fp8"],
        tmp_path,
        env=_env(site_dir, "1.2.1"),
        ready=False,
    ) as server:
        assert server.proc.wait(timeout=120) != 0
        assert "option.quantize" in server.log() and "already quantized" in server.log(), server.log()[-3000:]


@pytest.mark.parametrize("version, backend", [("1.2.1", "pytorch"), ("1.3.0", "auto")])
def test_a_quantization_the_pytorch_backend_cannot_load_is_refused_naming_the_key(
    hf_dir, site_dir, tmp_path, version, backend
):
    """SmoothQuant is a TensorRT-engine format: refused on the pytorch backend, and where no Executor is left."""
    with serve(
        [
            "--model-id",
            str(hf_dir),
            "--engine",
            "trtllm",
            *LIMITS,
            "-o",
            "option.quantize=smoothquant",
            "-o",
            f"option.backend={backend}",
        ],
        tmp_path,
        env=_env(site_dir, version),
        ready=False,
    ) as server:
        assert server.proc.wait(timeout=120) == 2
        log = server.log()
        assert "option.quantize" in log and "use fp8, fp8_kv or awq" in log and "option.backend=tensorrt" in log, log[
            -3000:
        ]
