"""Speculative decoding in the torch engine's built-in decode loop (CPU, fp32): n-gram drafts and a
draft model, verified in one target step per batch.

Greedy outputs must equal decoding without speculation (``model.generate``, wherever its choice is
clear: test_torch_engine.py's MARGIN rule) in mixed batches, with prompts cut into chunks, prefix
caching and preemption; sampling parameters, bans, stops, log-probs and max_new_tokens hold across
accepted tokens; seeded sampled requests draw the same tokens as without speculation (the unit tests
check the distribution of the verification itself); and the figures reach a real server's /metrics.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cliserver import serve
from sinks import RecordingSink, on_the_wire
from test_torch_engine import (
    assert_greedy,
    one_torch_thread,  # noqa: F401 - the same module-wide thread limit
    reference,
)
from tinymodels import tiny_model
from transformers import AutoModelForCausalLM

from lmi_trt.engines.base import EngineError, FinishReason, GenerationRequest, SamplingParams
from lmi_trt.engines.torch import TorchEngine, decode_loop
from lmi_trt.engines.torch.decode_loop import DecodeLoopBackend
from lmi_trt.speculative import Speculation, SpeculationError

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

# Prompts that repeat themselves (n-gram drafts find matches) and ones that do not.
PROMPTS = [
    [1, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6],
    [1, 40],
    [1] + list(range(100, 113)),
    [1, 7, 7, 7],
    [1, 20, 21, 22, 20, 21, 22, 20, 21, 22, 20, 21, 22, 20],
    [1, 3],
]
LENGTHS = [24, 3, 17, 9, 24, 13]


@pytest.fixture(scope="module")
def llama() -> Path:
    return tiny_model("llama")


@pytest.fixture(scope="module")
def shallow_draft(llama, tmp_path_factory) -> Path:
    """The target's first layer alone (and its embeddings and head): a draft that agrees with it often,
    not always. Saved with the target's tokenizer files."""
    out = tmp_path_factory.mktemp("draft")
    model = AutoModelForCausalLM.from_pretrained(str(llama))
    model.model.layers = model.model.layers[:1]
    model.config.num_hidden_layers = 1
    model.save_pretrained(str(out))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (llama / name).exists():
            (out / name).write_bytes((llama / name).read_bytes())
    return out


def ngram(k: int = 4, **kw) -> Speculation:
    return Speculation(method="ngram", max_draft_len=k, **kw)


def drafted(path: Path, k: int = 3, **kw) -> Speculation:
    """As option.speculative_draft_model (DJL's key) sets it."""
    keys = {"method": "option.speculative_draft_model", "draft_model": "option.speculative_draft_model"}
    return Speculation(method="draft_model", max_draft_len=k, draft_model=str(path), keys=keys, **kw)


def engine(path: Path, speculative: Speculation | None, **options) -> TorchEngine:
    settings = dict(max_batch_size=4, max_input_len=24, max_new_tokens=32, tokens_per_block=8) | options
    return TorchEngine(path, speculative=speculative, **settings)


async def run(e: TorchEngine, rid: str, prompt: list[int], stop_token_ids=(), **sampling) -> list:
    request = GenerationRequest(rid, prompt, SamplingParams(**sampling), stop_token_ids=list(stop_token_ids))
    return [o async for o in e.submit(request)]


def tokens(outs) -> list[int]:
    return [t for o in outs for t in o.token_ids]


def spec_counters(e: TorchEngine) -> dict[str, float]:
    return {k: v for k, v in e._backend.counters.items() if k.startswith("spec_") or k == "verify_steps"}


async def all_at_once(e: TorchEngine, path: Path, prompts=PROMPTS, lengths=LENGTHS) -> None:
    """Every prompt at once, greedy, ignore_eos: each ends on its length with no token repeated or
    skipped, and equals model.generate wherever its choice is clear."""
    ref = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    results = await asyncio.gather(
        *(run(e, f"r{i}", p, max_new_tokens=n, ignore_eos=True) for i, (p, n) in enumerate(zip(prompts, lengths)))
    )
    for prompt, n, outs in zip(prompts, lengths, results):
        assert len(tokens(outs)) == n and outs[-1].finish_reason == FinishReason.LENGTH
        assert all(o.token_ids for o in outs)
        assert_greedy(tokens(outs), reference(ref, prompt, n, eos_token_id=None))


@pytest.mark.parametrize("drafter", ["ngram", "own draft", "shallow draft", "other draft"])
async def test_greedy_equals_decoding_without_speculation_in_mixed_batches(drafter, llama, shallow_draft):
    """4 slots for 6 requests, steps of at most 12 tokens with prompts cut into chunks: verification
    steps alternate with steps that carry prompt chunks, requests join as others leave."""
    spec = {
        "ngram": ngram(),
        "own draft": drafted(llama),
        "shallow draft": drafted(shallow_draft),
        "other draft": drafted(tiny_model("qwen2")),
    }
    e = engine(llama, spec[drafter], max_num_tokens=12, enable_chunked_context=True)
    await e.start()
    try:
        await all_at_once(e, llama)
        counters = spec_counters(e)
        assert counters["verify_steps"] > 0 and counters["spec_decode_num_draft_tokens"] > 0
        if drafter == "own draft":  # the model as its own draft: every draft kept, across the chunk steps too
            assert counters["spec_decode_num_accepted_tokens"] == counters["spec_decode_num_draft_tokens"]
        elif drafter == "ngram":
            assert counters["spec_decode_num_accepted_tokens"] > 0
        # The random drafters (its first layer, another model) agree by chance: 2 of 79 draft tokens kept when
        # the loop waited for the device before every step of few requests, none of 88 when it waits only
        # before steps that may verify (the requests join at other steps). Their acceptance is no check.
        assert e._backend.counters["mixed_steps"] > 0
        await asyncio.sleep(0.2)  # the loop gives back the last requests' blocks after their last delivery
        assert e.stats().extra["kv_cache_used_blocks"] == 0  # rejected drafts' blocks were given back too
    finally:
        await e.close()


@pytest.mark.parametrize("drafter", ["ngram", "shallow draft"])
async def test_with_prefix_caching_and_preemption(drafter, llama, shallow_draft):
    """A pool of 8 blocks of 8 tokens (one request at full length needs 7) with prefix caching: requests
    preempt each other and resume, prompts share cached blocks, and outputs are unchanged."""
    spec = ngram() if drafter == "ngram" else drafted(shallow_draft)
    e = engine(llama, spec, max_num_tokens=24, max_tokens_in_paged_kv_cache=64, enable_kv_cache_reuse=True)
    await e.start()
    try:
        shared = [1] + list(range(60, 75))  # two blocks every prompt below starts with
        prompts = [shared + p[1:5] for p in PROMPTS[:4]]
        await all_at_once(e, llama, prompts, [32, 20, 28, 32])
        stats = e.stats().extra
        assert stats["num_preemptions"] > 0 and stats["prefix_cache_hits"] > 0
        assert spec_counters(e)["spec_decode_num_accepted_tokens"] > 0
    finally:
        await e.close()


async def test_stops_and_max_tokens_inside_accepted_drafts_end_there(llama, shallow_draft):
    """A stop sequence, EOS or max_new_tokens that falls inside a run of accepted drafts ends the request
    at that token, as decoding one token at a time would."""
    prompt = PROMPTS[4]
    plain = engine(llama, None)
    await plain.start()
    try:
        full = tokens(await run(plain, "ref", prompt, max_new_tokens=30, ignore_eos=True))
    finally:
        await plain.close()
    e = engine(llama, drafted(llama, k=4))  # the model as its own draft: every draft accepted
    await e.start()
    try:
        for stop_at in (5, 11):
            outs = await run(
                e, f"s{stop_at}", prompt, max_new_tokens=30, stop_token_ids=[full[stop_at - 1 : stop_at + 1]]
            )
            first = next(i for i in range(1, 30) if full[i - 1 : i + 1] == full[stop_at - 1 : stop_at + 1])
            assert tokens(outs) == full[: first + 1] and outs[-1].finish_reason == FinishReason.STOP_SEQUENCE
        for n in (1, 6, 7, 13):  # not multiples of the 5 tokens a fully accepted step emits
            outs = await run(e, f"n{n}", prompt, max_new_tokens=n, ignore_eos=True)
            assert tokens(outs) == full[:n] and outs[-1].finish_reason == FinishReason.LENGTH
        assert max(len(o.token_ids) for o in outs) > 1  # several tokens a step: the drafts were kept
    finally:
        await e.close()
    # EOS: an engine whose EOS is a token the continuation reaches mid-way.
    eos = next(t for t in full[6:] if t not in full[:6])
    e = TorchEngine(
        llama,
        max_batch_size=2,
        max_input_len=24,
        max_new_tokens=32,
        speculative=drafted(llama, k=4),
        eos_token_ids=[eos],
    )
    await e.start()
    try:
        outs = await run(e, "eos", prompt, max_new_tokens=30)
        assert tokens(outs) == full[: full.index(eos) + 1] and outs[-1].finish_reason == FinishReason.EOS
    finally:
        await e.close()


async def test_behind_a_sink_verified_tokens_are_on_the_wire_what_submit_streams(llama, monkeypatch):
    """Through the engine's sink (the engine link's), a verification step's tokens reach it as ``submit`` streams
    them, ``_wire`` of each output: several tokens in one plain delta, with their log-probs; top log-probs never
    plain; a stop or max_new_tokens inside accepted drafts; and a step that keeps a token and then fails (NaN
    logits at its next position) a plain delta then the error. One request at a time: the same steps each way."""
    prompt = PROMPTS[4]
    failing = {"at": 0, "calls": 0}
    original = decode_loop.verify

    def verify(*args, **kwargs):
        tokens_, logprobs, status, emitted = original(*args, **kwargs)
        failing["calls"] += 1
        if failing["calls"] == failing["at"]:  # every position after the first: NaN/inf logits
            status = status.clone()
            status[:, 1:] = 1
        return tokens_, logprobs, status, emitted

    monkeypatch.setattr(decode_loop, "verify", verify)
    e = engine(llama, drafted(llama, k=4))  # the model as its own draft: every draft accepted
    await e.start()
    try:
        full = tokens(await run(e, "ref", prompt, max_new_tokens=30, ignore_eos=True))
        requests = [
            GenerationRequest("lp", prompt, SamplingParams(max_new_tokens=20, logprobs=True, ignore_eos=True)),
            GenerationRequest("top", prompt, SamplingParams(max_new_tokens=12, top_logprobs=2, ignore_eos=True)),
            GenerationRequest("n", prompt, SamplingParams(max_new_tokens=13, ignore_eos=True)),
            GenerationRequest("stop", prompt, SamplingParams(max_new_tokens=30), stop_token_ids=[full[10:12]]),
            GenerationRequest("nan", prompt, SamplingParams(max_new_tokens=30, logprobs=True, ignore_eos=True)),
        ]
        sink = RecordingSink()
        e.attach(sink)
        for r in requests:
            failing["calls"], failing["at"] = 0, 3 if r.request_id == "nan" else 0
            submitted = [o async for o in e.submit(r)]
            failing["calls"] = 0
            e.submit_to_sink(r)
            await sink.wait(r.request_id)
            assert sink.wired(r.request_id) == [on_the_wire(o) for o in submitted], r.request_id
            deltas = [out for kind, out in sink.stream(r.request_id) if kind == "deltas"]
            if r.request_id != "top":
                assert any(len(d[1]) > 1 for d in deltas), r.request_id  # a step's accepted tokens in one
            else:
                assert not deltas
        *_, (kept_kind, kept), (_, error) = sink.stream("nan")
        assert kept_kind == "deltas" and kept[1] and error.error_code == 424  # the step's token, then its failure
    finally:
        await e.close()


async def test_requests_at_the_end_of_their_positions_draft_beside_others(llama):
    """A request whose last positions leave room for fewer drafts than another's, in the same steps: the
    draft model's passes past its last position write nothing and read within the tables."""
    e = engine(llama, drafted(llama, k=6))  # its own draft: 7 tokens a step, so the long one reaches 30
    await e.start()
    ref = AutoModelForCausalLM.from_pretrained(str(llama)).eval()
    try:
        long = [1] + list(range(40, 63))  # 24 tokens: with 32 new ones, every one of the 56 positions
        got: list[int] = []
        late = None
        async for out in e.submit(GenerationRequest("long", long, SamplingParams(max_new_tokens=32, ignore_eos=True))):
            got += out.token_ids
            if late is None and len(got) >= 12:  # it joins when the long one has 20 tokens or fewer to go
                late = asyncio.create_task(run(e, "late", [1, 5], max_new_tokens=32, ignore_eos=True))
        assert_greedy(got, reference(ref, long, 32, eos_token_id=None))
        assert_greedy(tokens(await late), reference(ref, [1, 5], 32, eos_token_id=None))
        assert spec_counters(e)["spec_decode_num_accepted_tokens"] > 0
    finally:
        await e.close()


# The decode loop with the decoder's Triton kernels forced on, run by Triton's CPU interpreter (TRITON_INTERPRET
# is read when the kernels are defined, hence a process of its own): prints each engine's tokens and counters.
INTERPRETED = """
import asyncio, json, sys
import torch
from lmi_trt.engines.torch import decode_kernels
decode_kernels.available = lambda device, head_dim: True
from lmi_trt.engines.base import GenerationRequest, SamplingParams
from lmi_trt.engines.torch import TorchEngine
from lmi_trt.speculative import Speculation
torch.set_num_threads(1)
path, prompts, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])

async def run(spec):
    e = TorchEngine(path, speculative=spec, max_batch_size=4, max_input_len=24, max_new_tokens=32, tokens_per_block=8)
    await e.start()
    try:
        assert e._backend._decoder.fused_kernels
        async def one(i, p):
            request = GenerationRequest(f"r{i}", p, SamplingParams(max_new_tokens=n, ignore_eos=True))
            return [t async for o in e.submit(request) for t in o.token_ids]
        tokens = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
        return {"tokens": tokens, "counters": e._backend.counters}
    finally:
        await e.close()

specs = {
    "ngram": Speculation(method="ngram", max_draft_len=4),
    "self": Speculation(method="draft_model", max_draft_len=3, draft_model=path),
}
print(json.dumps({name: asyncio.run(run(spec)) for name, spec in specs.items()}))
"""


async def test_the_gpu_paths_kernels_verify_drafts_as_the_torch_operations_do(llama):
    """On CUDA the decoder runs Triton kernels (paged attention of k + 1 queries a sequence, rotary and cache
    writes of several tokens a sequence), not the torch operations the other tests here run: forced on under
    Triton's interpreter, n-gram drafts and the model as its own draft give model.generate's greedy tokens, and
    the model drafting for itself keeps (nearly) every draft: a verification that read the wrong rows or
    positions would reject them."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(root), str(root / "tests")]))
    prompts, n = PROMPTS[:4], 12
    done = subprocess.run(
        [sys.executable, "-c", INTERPRETED, str(llama), json.dumps(prompts), str(n)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    ref = AutoModelForCausalLM.from_pretrained(str(llama)).eval()
    for prompt, *got in zip(prompts, results["ngram"]["tokens"], results["self"]["tokens"]):
        expected = reference(ref, prompt, n, eos_token_id=None)
        for tokens_ in got:
            assert_greedy(tokens_, expected)
    ngram, self_ = results["ngram"]["counters"], results["self"]["counters"]
    assert ngram["verify_steps"] > 0 and ngram["spec_decode_num_accepted_tokens"] > 0
    drafted, kept = self_["spec_decode_num_draft_tokens"], self_["spec_decode_num_accepted_tokens"]
    assert drafted > 0 and kept >= 0.9 * drafted


SAMPLING = [
    dict(repetition_penalty=1.8),
    dict(presence_penalty=1.5, frequency_penalty=0.7),
    dict(min_new_tokens=10, ignore_eos=False),
    dict(bad_words=True),
    dict(logprobs=True, top_logprobs=3),
    dict(logit_bias=((9, 5.0), (30, -100.0))),
]


def request(rid: str, prompt: list[int], n: int, bad_words: bool = False, **sampling) -> GenerationRequest:
    sampling = {"ignore_eos": True} | sampling
    bans = [[17], [30, 31]] if bad_words else []  # a single-token and a two-token bad word
    return GenerationRequest(rid, prompt, SamplingParams(max_new_tokens=n, **sampling), bad_words_ids=bans)


async def outputs_of(e: TorchEngine, requests: list[GenerationRequest]) -> list[list]:
    """One request at a time: the same batch shapes every run."""
    out = []
    for r in requests:
        out.append([o async for o in e.submit(r)])
    return out


async def test_sampling_parameters_bans_and_logprobs_hold_across_accepted_tokens(llama, shallow_draft):
    """Penalties, min_new_tokens, single- and multi-token bad words, logit_bias and log-probs (the token's
    and the top alternatives) come out as without speculation, greedy and seeded-sampled alike."""
    requests = []
    for i, sampling in enumerate(SAMPLING):
        for prompt in (PROMPTS[0], PROMPTS[4]):
            requests.append(request(f"g{i}-{len(requests)}", prompt, 20, **sampling))
            requests.append(
                request(
                    f"s{i}-{len(requests)}", prompt, 20, do_sample=True, temperature=0.9, top_k=40, seed=i, **sampling
                )
            )
    results = {}
    for name, spec in (("off", None), ("ngram", ngram()), ("draft", drafted(shallow_draft))):
        e = engine(llama, spec)
        await e.start()
        try:
            results[name] = await outputs_of(e, requests)
            if spec is not None:
                assert spec_counters(e)["spec_decode_num_accepted_tokens"] > 0
        finally:
            await e.close()
    for name in ("ngram", "draft"):
        for req, base, got in zip(requests, results["off"], results[name]):
            assert tokens(got) == tokens(base), (name, req.request_id)
            assert got[-1].finish_reason == base[-1].finish_reason
            if req.sampling.logprobs:
                lps = [lp for o in got for lp in o.logprobs]
                assert lps == pytest.approx([lp for o in base for lp in o.logprobs], abs=1e-4)
                tops = [t for o in got for t in o.top_logprobs]
                assert [[i for i, _ in t] for t in tops] == [[i for i, _ in t] for o in base for t in o.top_logprobs]
            if req.bad_words_ids:
                seq = tokens(got)
                assert 17 not in seq and all(seq[i : i + 2] != [30, 31] for i in range(len(seq)))


async def test_seeded_sampling_draws_the_same_tokens_as_without_speculation(llama, shallow_draft):
    """Verification draws each position's token with the uniforms decoding would use there and keeps a
    draft when it is that token (rejection sampling for one-hot drafts): per seed, the same tokens."""
    requests = [
        GenerationRequest(
            f"r{seed}",
            PROMPTS[seed % 2 * 4],
            SamplingParams(max_new_tokens=12, do_sample=True, temperature=0.8, top_k=3, seed=seed, ignore_eos=True),
        )
        for seed in range(24)
    ]
    runs = []
    for spec in (None, ngram(), drafted(shallow_draft)):
        e = engine(llama, spec)
        await e.start()
        try:
            runs.append([tokens(outs) for outs in await outputs_of(e, requests)])
            counters = spec_counters(e)
            if spec is not None:  # drafts were verified; the draft model's partly kept (n-gram drafts of
                # the tiny model's sampled text rarely match)
                assert counters["spec_decode_num_draft_tokens"] > 0
            if spec is not None and spec.method == "draft_model":
                assert 0 < counters["spec_decode_num_accepted_tokens"] < counters["spec_decode_num_draft_tokens"]
        finally:
            await e.close()
    assert runs[1] == runs[0] and runs[2] == runs[0]
    assert len({tuple(r[:3]) for r in runs[0]}) > 12  # they really are sampled


async def test_verification_steps_stay_within_the_request_limit(llama, monkeypatch):
    """With max_concurrency 2, no verification step carries more than 2 requests: with 4 running, steps
    decode one token each, pipelined; as requests finish, the remaining ones speculate."""
    sizes = []
    original = DecodeLoopBackend._launch_spec

    def launch(self, rows, proposal):
        sizes.append(len(rows))
        return original(self, rows, proposal)

    monkeypatch.setattr(DecodeLoopBackend, "_launch_spec", launch)
    e = engine(llama, ngram(max_concurrency=2))
    await e.start()
    try:
        await all_at_once(e, llama, PROMPTS[:4], [30, 8, 12, 30])
        assert sizes and max(sizes) <= 2
        assert e._backend.counters["decode_steps"] > 0
    finally:
        await e.close()


async def test_what_the_engine_cannot_run_is_refused_at_start(llama, tmp_path):
    gpt2, big_vocab = tiny_model("gpt2"), tmp_path / "wide"
    import transformers as tf

    torch.manual_seed(0)
    wide = AutoModelForCausalLM.from_config(
        tf.LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=600)
    )
    wide.save_pretrained(str(big_vocab))
    for draft, message in [
        (gpt2, "the decode loop cannot run it: model_type 'gpt2'"),
        (big_vocab, "600 tokens, the model's 512"),
    ]:
        with pytest.raises(SpeculationError, match=message) as err:
            await engine(llama, drafted(draft)).start()
        assert err.value.key == "option.speculative_draft_model"
    # Speculation is the built-in loop's: where transformers' batching runs, it is refused.
    with pytest.raises(EngineError, match="option.speculative_config=ngram .speculative decoding.") as err:
        await engine(llama, ngram(keys={"method": "option.speculative_config"}), decode_loop="transformers").start()
    assert err.value.code == 400


async def test_the_cli_refuses_a_method_the_torch_engine_does_not_run(tmp_path):
    args = ["--engine", "torch", "--model-id", str(tiny_model("llama")), "--port", "0"]
    config = {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}
    proc = subprocess.run(
        [sys.executable, "-m", "lmi_trt", "serve", *args, "-o", f"option.speculative_config={json.dumps(config)}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "option.speculative_config.decoding_type='eagle3'" in proc.stderr
    assert "TensorRT-LLM's pytorch backend (option.rolling_batch=trtllm, option.backend=pytorch)" in proc.stderr


async def test_a_real_server_logs_the_method_and_exports_the_figures(tmp_path, llama):
    """option.* keys → sources (the draft model's folder) → the engine → /metrics. The model is its own
    draft here, so drafts are kept (and the figures cannot be zero by accident)."""
    draft_config = {"method": "draft_model", "num_speculative_tokens": 3, "model": str(llama)}
    args = ["--engine", "torch", "--model-id", str(llama), "--model-name", "tiny"]
    for key, value in [
        ("max_input_len", 64),
        ("max_output_len", 24),
        ("speculative_config", json.dumps(draft_config)),
    ]:
        args += ["-o", f"option.{key}={value}"]
    with serve(args, tmp_path) as server:
        assert "speculative decoding: a draft model (LlamaForCausalLM" in server.log()
        assert "up to 3 draft tokens a step" in server.log()
        body = {"inputs": "The quick brown fox. The quick brown fox. The quick", "parameters": {"max_new_tokens": 20}}
        response = server.post("/invocations", json=body)
        assert response.status_code == 200 and response.json()["generated_text"]
        metrics = server.get("/metrics").text
    values = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("lmi_spec") and "{" in line and "position" not in line
    }
    assert values["lmi_spec_decode_num_drafts_total"] > 0
    assert values["lmi_spec_decode_num_draft_tokens_total"] >= values["lmi_spec_decode_num_accepted_tokens_total"] > 0
    assert 0 < values["lmi_spec_decode_draft_acceptance_rate"] <= 1
    assert 'lmi_spec_decode_num_accepted_tokens_per_pos_total{model_name="tiny",position="0"}' in metrics
