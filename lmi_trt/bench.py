"""`lmi-trt bench`: a streaming load generator for LMI, OpenAI and TGI endpoints.

Closed-loop load: at each concurrency level, that many workers each send one streaming
request, read it to the end, and send the next, until the level's request budget
(``--requests``) or time (``--duration``) is spent. Reported per level: requests/s, output
tokens/s, time to first token (TTFT), inter-token latency (ITL), time per output token
(TPOT), end-to-end latency (p50/p90/p99), errors, and the CPU the client (and a server we
started or were told the pid of) used.

The client is built to cost far less per token than any server it measures, so that it is
never what limits the figures:

* it runs in its own process(es) (``--client-procs``), never in the server's;
* request bodies are encoded once, before the clock starts;
* streams are parsed incrementally per network read, not per record: the complete lines of
  each read are counted with one ``bytes.count`` of a marker that only token records carry
  (``"token"`` for LMI jsonlines and TGI SSE, ``"finish_reason"`` for OpenAI SSE, whose
  events are parsed one by one only until the first token, to skip chat's role chunk);
  only the last records of a stream are decoded, for ``generated_text``, ``details`` /
  ``usage`` and error records;
* ITL is recorded per read: a read carrying k tokens after a gap g adds k samples of g/k
  (stored as one weighted sample); tokens that arrive in the same read as the first one add
  samples of 0, so every request contributes (tokens - 1) ITL samples.

Token counts: the number of token records streamed, replaced by ``details.generated_tokens``
(LMI, TGI) or ``usage.completion_tokens`` (OpenAI, requested through
``stream_options.include_usage``) where the server reports them; requests where the two
disagree are counted in ``token_count_mismatches``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:  # orjson is a dependency of the server; json is a fallback for a bare client host
    import orjson

    _loads = orjson.loads

    def _dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)
except ImportError:  # pragma: no cover
    _loads = json.loads

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


APIS = ("lmi", "openai", "tgi")
OPENAI_ENDPOINTS = ("completions", "chat")
DEFAULT_CONCURRENCY = "1,16,64,256"
PERCENTILES = (50, 90, 99)

# Common, short English words: one token each in most BPE vocabularies (with their leading
# space), so a prompt of N words is about N tokens. Pass --tokenizer for exact counts.
WORDS = (
    "the of and to in is was for on that with as by at from his it an were are which this be has had "
    "not but they have one their or its new first been after who also can two all when more time into "
    "other some than there over only most people would about out like then year years many these made "
    "part used three world city state such between during while where each back under work well since "
    "water long great team game end may own because found both high life best school day family early "
    "still small order second house through left place old area name group days four before line early "
    "country way small number music book down man war long set power last song him way show good later "
    "around within side based five even public often just known road near light next field major near "
    "south north east west local form open story round land play live love point film main among head "
    "red blue green river town church young hand body free art lead king move real half six room"
).split()


# ---------------------------------------------------------------------------------------------
# Length distributions and prompts


@dataclass(frozen=True)
class LengthDist:
    """A token count: fixed (``128``) or uniform over an inclusive range (``64:256``)."""

    lo: int
    hi: int

    @classmethod
    def parse(cls, text: str) -> LengthDist:
        text = str(text).strip()
        lo_s, sep, hi_s = text.partition(":")
        try:
            lo = int(lo_s)
            hi = int(hi_s) if sep else lo
        except ValueError:
            raise ValueError(f"expected N or LO:HI (tokens), got {text!r}") from None
        if lo < 1 or hi < lo:
            raise ValueError(f"expected 1 <= LO <= HI, got {text!r}")
        return cls(lo, hi)

    def sample(self, rng: random.Random) -> int:
        return self.lo if self.lo == self.hi else rng.randint(self.lo, self.hi)

    @property
    def mean(self) -> float:
        return (self.lo + self.hi) / 2

    def __str__(self) -> str:
        return str(self.lo) if self.lo == self.hi else f"{self.lo}:{self.hi}"


class PromptFactory:
    """Prompts of random common words: ~N tokens, or exactly N with a tokenizer."""

    def __init__(self, tokenizer_dir: str | os.PathLike | None = None):
        self.tokenizer = None
        if tokenizer_dir:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))

    @property
    def exact(self) -> bool:
        return self.tokenizer is not None

    def make(self, n_tokens: int, rng: random.Random) -> tuple[str, int]:
        """(prompt, its token count: exact with a tokenizer, else the word count)."""
        if self.tokenizer is None:
            return " ".join(rng.choices(WORDS, k=n_tokens)), n_tokens
        return self._exact(n_tokens, rng)

    def _exact(self, n: int, rng: random.Random) -> tuple[str, int]:
        tok = self.tokenizer
        ids: list[int] = []
        while len(ids) < n + 8:
            ids += tok.encode(" " + " ".join(rng.choices(WORDS, k=n + 8)), add_special_tokens=False)
        target = n
        best: tuple[tuple[bool, int], str, int] | None = None
        for _ in range(8):  # decode→re-encode can merge or split at the cut; steer the cut
            text = tok.decode(ids[:target]).strip()
            got = len(tok.encode(text, add_special_tokens=False))
            # never over n where a cut at or under it was seen: a server whose max_input_len is n refuses n + 1
            rank = (got > n, abs(got - n))
            if best is None or rank < best[0]:
                best = (rank, text, got)
            if got == n:
                break
            target = max(1, min(len(ids), target + (n - got)))
        assert best is not None
        return best[1], best[2]


# ---------------------------------------------------------------------------------------------
# Request bodies


def route_for(api: str, openai_endpoint: str = "completions") -> str:
    if api == "lmi":
        return "/invocations"
    if api == "tgi":
        return "/generate_stream"
    if api == "openai":
        return "/v1/chat/completions" if openai_endpoint == "chat" else "/v1/completions"
    raise ValueError(f"unknown api {api!r}; expected one of {', '.join(APIS)}")


def build_body(
    api: str,
    prompt: str,
    max_new_tokens: int,
    *,
    openai_endpoint: str = "completions",
    model: str = "model",
    ignore_eos: bool = False,
    details: bool = False,
) -> bytes:
    """The JSON body of one streaming request (greedy, so servers take their fastest path)."""
    if api in ("lmi", "tgi"):
        params: dict[str, Any] = {"max_new_tokens": max_new_tokens, "do_sample": False}
        if ignore_eos:
            params["ignore_eos"] = True
        if details:
            params["details"] = True
        body: dict[str, Any] = {"inputs": prompt, "parameters": params}
        if api == "lmi":
            body["stream"] = True
        return _dumps(body)
    if api == "openai":
        body = {
            "model": model,
            "max_tokens": max_new_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if openai_endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if ignore_eos:
            body["ignore_eos"] = True
        return _dumps(body)
    raise ValueError(f"unknown api {api!r}; expected one of {', '.join(APIS)}")


@dataclass
class Workload:
    """Pre-encoded request bodies, cycled through by the workers."""

    api: str
    path: str
    bodies: list[bytes]
    prompt_tokens: list[int]
    output_tokens: list[int]
    prompt_dist: str
    output_dist: str
    prompt_tokens_exact: bool


def build_workload(
    api: str,
    prompt_dist: LengthDist,
    output_dist: LengthDist,
    *,
    n: int = 256,
    seed: int = 0,
    tokenizer_dir: str | os.PathLike | None = None,
    openai_endpoint: str = "completions",
    model: str = "model",
    ignore_eos: bool = False,
    details: bool = False,
) -> Workload:
    rng = random.Random(seed)
    factory = PromptFactory(tokenizer_dir)
    bodies, p_tok, o_tok = [], [], []
    for _ in range(max(1, n)):
        prompt, np_ = factory.make(prompt_dist.sample(rng), rng)
        no = output_dist.sample(rng)
        bodies.append(
            build_body(
                api, prompt, no, openai_endpoint=openai_endpoint, model=model, ignore_eos=ignore_eos, details=details
            )
        )
        p_tok.append(np_)
        o_tok.append(no)
    return Workload(
        api, route_for(api, openai_endpoint), bodies, p_tok, o_tok, str(prompt_dist), str(output_dist), factory.exact
    )


# ---------------------------------------------------------------------------------------------
# Stream parsers


@dataclass
class StreamEnd:
    """What the end of a stream said."""

    extra_tokens: int = 0  # token records in a final line that had no trailing newline
    complete: bool = False  # the protocol's final record / terminator was seen
    reported_tokens: int | None = None  # details.generated_tokens or usage.completion_tokens
    error: str | None = None  # an error record ended the stream


class StreamParser:
    """Incremental token counting over a byte stream; one instance per response.

    ``feed(bytes) -> int`` returns how many token records the complete lines of the stream
    received so far added; ``finish() -> StreamEnd`` is called once at the end.
    """

    MARK = b'"token"'

    __slots__ = ("buf", "t0", "t1", "t2")

    def __init__(self) -> None:
        self.buf = b""
        self.t0 = self.t1 = self.t2 = b""  # the last three non-blank regions, for finish()

    def feed(self, data: bytes) -> int:
        if self.buf:
            data = self.buf + data
        cut = data.rfind(b"\n")
        if cut < 0:
            self.buf = data
            return 0
        cut += 1
        if cut < len(data):
            self.buf = data[cut:]
            data = data[:cut]
        else:
            self.buf = b""
        if len(data) > 2 or not data.isspace():
            self.t0, self.t1, self.t2 = self.t1, self.t2, data
        return self._count(data)

    def _count(self, region: bytes) -> int:
        return region.count(self.MARK)

    def finish(self) -> StreamEnd:
        end = StreamEnd()
        rest = self.buf
        self.buf = b""
        if rest.strip():
            end.extra_tokens = self._count(rest)
        records = [r for r in (self.t0 + self.t1 + self.t2 + rest).split(b"\n") if r.strip()]
        self._final(records[-4:], end)
        return end

    def _final(self, records: list[bytes], end: StreamEnd) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


def _error_of(obj: Any) -> str | None:
    """The message of an error record (DJL/LMI, TGI and OpenAI shapes), else None."""
    if not isinstance(obj, dict):
        return None
    err = obj.get("error")
    if err:
        if isinstance(err, dict):
            return str(err.get("message") or err)
        return str(err)
    if obj.get("object") == "error":
        return str(obj.get("message") or obj)
    code = obj.get("code")
    if isinstance(code, int) and code >= 400 and "token" not in obj:
        return f"{code}: {obj.get('message') or obj.get('error') or obj}"
    details = obj.get("details")
    if isinstance(details, dict) and details.get("finish_reason") == "error":
        return str(details.get("error") or details.get("message") or "finish_reason=error")
    return None


def _sse_json(record: bytes) -> Any:
    record = record.strip()
    if not record.startswith(b"data:"):
        return None
    body = record[5:].strip()
    if body == b"[DONE]":
        return "[DONE]"
    try:
        return _loads(body)
    except ValueError:
        return None


class LmiParser(StreamParser):
    """DJL/LMI ``application/jsonlines``: one ``{"token": {...}}`` per line, the last one adds
    ``generated_text`` (and ``details`` when asked for)."""

    __slots__ = ()

    def _final(self, records: list[bytes], end: StreamEnd) -> None:
        if not records:
            return
        try:
            obj = _loads(records[-1])
        except ValueError:
            end.error = f"unparseable last record: {records[-1][:200]!r}"
            return
        end.error = _error_of(obj)
        if isinstance(obj, dict):
            end.complete = "generated_text" in obj and end.error is None
            details = obj.get("details")
            if isinstance(details, dict) and isinstance(details.get("generated_tokens"), int):
                end.reported_tokens = details["generated_tokens"]


class TgiParser(StreamParser):
    """TGI ``text/event-stream``: ``data:{"token":{...},"generated_text":null,...}`` events, the
    last with ``generated_text`` set (and ``details`` when asked for)."""

    __slots__ = ()

    def _final(self, records: list[bytes], end: StreamEnd) -> None:
        for rec in reversed(records):
            obj = _sse_json(rec)
            if not isinstance(obj, dict):
                continue
            end.error = _error_of(obj)
            end.complete = obj.get("generated_text") is not None and end.error is None
            details = obj.get("details")
            if isinstance(details, dict) and isinstance(details.get("generated_tokens"), int):
                end.reported_tokens = details["generated_tokens"]
            return


class OpenAIParser(StreamParser):
    """OpenAI ``text/event-stream`` (completions or chat): ``data: {chunk}`` events ending with
    ``data: [DONE]``. Until the first token, events are decoded one by one (chat's first chunk
    carries only the role); after it, each event with a ``finish_reason`` key is one token
    chunk. ``usage.completion_tokens`` (include_usage) replaces the count when present."""

    MARK = b'"finish_reason"'
    __slots__ = ("started",)

    def __init__(self) -> None:
        super().__init__()
        self.started = False

    def _count(self, region: bytes) -> int:
        if self.started:
            return region.count(self.MARK)
        n = 0
        for line in region.split(b"\n"):
            obj = _sse_json(line)
            if isinstance(obj, dict) and self._is_token(obj):
                n += 1
        if n:
            self.started = True
        return n

    @staticmethod
    def _is_token(obj: dict) -> bool:
        choices = obj.get("choices")
        if not choices or not isinstance(choices, list):
            return False
        ch = choices[0]
        if not isinstance(ch, dict):
            return False
        delta = ch.get("delta")
        if isinstance(delta, dict):  # chat: skip the role-only opening chunk
            return bool(delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content")) or (
                "role" not in delta and "finish_reason" in ch
            )
        return "text" in ch or "finish_reason" in ch

    def _final(self, records: list[bytes], end: StreamEnd) -> None:
        for rec in records:
            obj = _sse_json(rec)
            if obj == "[DONE]":
                end.complete = True
            elif isinstance(obj, dict):
                err = _error_of(obj)
                if err:
                    end.error = err
                    continue
                usage = obj.get("usage")
                if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                    end.reported_tokens = usage["completion_tokens"]
                for ch in obj.get("choices") or ():
                    if isinstance(ch, dict) and ch.get("finish_reason") == "error":
                        end.error = "finish_reason=error"
        if end.error:
            end.complete = False


PARSERS: dict[str, type[StreamParser]] = {"lmi": LmiParser, "tgi": TgiParser, "openai": OpenAIParser}


# ---------------------------------------------------------------------------------------------
# Percentiles and summaries


def percentile(sorted_values, q: float) -> float:
    """Linear-interpolated percentile (numpy's default) of already sorted values; nan if empty."""
    n = len(sorted_values)
    if n == 0:
        return math.nan
    if n == 1:
        return float(sorted_values[0])
    pos = (n - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def summarize(values, qs=PERCENTILES) -> dict[str, float]:
    """{'mean', 'p50', ...} of plain samples; NaN-free output uses None for 'no samples'."""
    vals = sorted(values)
    if not vals:
        return {"n": 0, "mean": None, **{f"p{q}": None for q in qs}}
    out: dict[str, float] = {"n": len(vals), "mean": math.fsum(vals) / len(vals)}
    for q in qs:
        out[f"p{q}"] = percentile(vals, q)
    return out


def weighted_percentiles(values, weights, qs=PERCENTILES) -> dict[str, float | None]:
    """Nearest-rank percentiles of samples where ``values[i]`` stands for ``weights[i]`` samples."""
    if len(values) != len(weights):
        raise ValueError("values and weights differ in length")
    total = sum(weights)
    if not values or total <= 0:
        return {f"p{q}": None for q in qs}
    try:
        import numpy as np

        v = np.asarray(values, dtype=float)
        w = np.asarray(weights, dtype=float)
        order = np.argsort(v, kind="stable")
        cum = np.cumsum(w[order])
        out = {}
        for q in qs:
            rank = max(1.0, math.ceil(q / 100.0 * total))
            idx = int(np.searchsorted(cum, rank - 1e-9, side="left"))
            out[f"p{q}"] = float(v[order[min(idx, len(v) - 1)]])
        return out
    except ImportError:  # pragma: no cover
        pairs = sorted(zip(values, weights))
        out = {}
        for q in qs:
            rank = max(1.0, math.ceil(q / 100.0 * total))
            acc = 0.0
            for val, w in pairs:
                acc += w
                if acc >= rank - 1e-9:
                    out[f"p{q}"] = float(val)
                    break
        return out


def weighted_summary(values, weights, qs=PERCENTILES) -> dict[str, float | None]:
    total = sum(weights)
    mean = (math.fsum(v * w for v, w in zip(values, weights)) / total) if total else None
    return {"n": int(total), "mean": mean, **weighted_percentiles(values, weights, qs)}


# ---------------------------------------------------------------------------------------------
# The load itself


@dataclass
class RawLevel:
    """Per-request samples of one level from one client process (merged across processes)."""

    t_start: float = math.inf
    t_end: float = 0.0
    ok: int = 0
    errors: int = 0
    error_samples: dict[str, int] = field(default_factory=dict)
    output_tokens: int = 0
    streamed_records: int = 0
    prompt_tokens: int = 0
    mismatches: int = 0
    ttft: array = field(default_factory=lambda: array("d"))
    e2e: array = field(default_factory=lambda: array("d"))
    tpot: array = field(default_factory=lambda: array("d"))
    itl: array = field(default_factory=lambda: array("d"))
    itl_w: array = field(default_factory=lambda: array("l"))
    client_cpu_s: float = 0.0
    client_procs: int = 1
    server_cpu0: float | None = None  # server CPU seconds at the measured start / end
    server_cpu1: float | None = None

    def add_error(self, msg: str) -> None:
        self.errors += 1
        msg = msg[:300]
        if msg in self.error_samples or len(self.error_samples) < 8:
            self.error_samples[msg] = self.error_samples.get(msg, 0) + 1

    def merge(self, other: RawLevel) -> None:
        self.t_start = min(self.t_start, other.t_start)
        self.t_end = max(self.t_end, other.t_end)
        for name in (
            "ok",
            "errors",
            "output_tokens",
            "streamed_records",
            "prompt_tokens",
            "mismatches",
            "client_cpu_s",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for msg, k in other.error_samples.items():
            if msg in self.error_samples or len(self.error_samples) < 8:
                self.error_samples[msg] = self.error_samples.get(msg, 0) + k
        for name in ("ttft", "e2e", "tpot", "itl", "itl_w"):
            getattr(self, name).extend(getattr(other, name))
        if other.server_cpu0 is not None:
            self.server_cpu0 = (
                other.server_cpu0 if self.server_cpu0 is None else min(self.server_cpu0, other.server_cpu0)
            )
        if other.server_cpu1 is not None:
            self.server_cpu1 = (
                other.server_cpu1 if self.server_cpu1 is None else max(self.server_cpu1, other.server_cpu1)
            )

    @property
    def server_cpu_s(self) -> float | None:
        if self.server_cpu0 is None or self.server_cpu1 is None:
            return None
        return self.server_cpu1 - self.server_cpu0


@dataclass
class LevelSpec:
    url: str  # base URL, e.g. http://127.0.0.1:8080
    concurrency: int
    requests: int | None  # total for the level (None: until duration)
    duration: float | None  # seconds (None: until requests)
    warmup: int = 0  # requests sent (and not measured) before the level starts
    timeout: float = 600.0
    loop: str = "auto"
    server_pid: int | None = None  # sample this process's CPU over the measured window


def _install_loop(choice: str) -> str:
    if choice in ("auto", "uvloop"):
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
            return "uvloop"
        except ImportError:
            if choice == "uvloop":
                raise SystemExit("--loop uvloop: uvloop is not installed (pip install uvloop)") from None
    asyncio.set_event_loop_policy(None)
    return "asyncio"


async def _run_level_async(spec: LevelSpec, wl: Workload, offset: int = 0, barrier=None) -> RawLevel:
    import aiohttp

    raw = RawLevel()
    url = spec.url.rstrip("/") + wl.path
    bodies, ptoks = wl.bodies, wl.prompt_tokens
    nb = len(bodies)
    parser_cls = PARSERS[wl.api]
    headers = {"Content-Type": "application/json", "Accept": "*/*"}
    perf = time.perf_counter
    conc = max(1, spec.concurrency)
    connector = aiohttp.TCPConnector(limit=conc, limit_per_host=conc, ttl_dns_cache=None, enable_cleanup_closed=False)
    timeout = aiohttp.ClientTimeout(total=spec.timeout, sock_connect=30)
    ttft_a, e2e_a, tpot_a = raw.ttft.append, raw.e2e.append, raw.tpot.append
    itl_a, itlw_a = raw.itl.append, raw.itl_w.append
    state = {"next": offset}
    junk: list = []  # warm-up requests' ITL samples

    async def one(session, i: int, record: bool) -> None:
        body = bodies[i % nb]
        t0 = perf()
        n = 0
        t_first = t_prev = 0.0
        ia, iw = (itl_a, itlw_a) if record else (junk.append, junk.append)
        try:
            async with session.post(url, data=body, headers=headers) as resp:
                if resp.status != 200:
                    text = (await resp.read())[:300].decode("utf-8", "replace")
                    if record:
                        raw.add_error(f"HTTP {resp.status}: {text}")
                    return
                parser = parser_cls()
                feed = parser.feed
                async for data in resp.content.iter_any():
                    k = feed(data)
                    if k:
                        now = perf()
                        if n:
                            ia((now - t_prev) / k)
                            iw(k)
                        else:
                            t_first = now
                            if k > 1:  # tokens that came with the first one: no gap seen
                                ia(0.0)
                                iw(k - 1)
                        t_prev = now
                        n += k
                end = parser.finish()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # connection reset, timeout, payload error: one failed request
            if record:
                raw.add_error(f"{type(e).__name__}: {e}")
            return
        t_end = perf()
        if not record:
            return
        if end.extra_tokens:
            if n:
                ia((t_end - t_prev) / end.extra_tokens)
                iw(end.extra_tokens)
            else:
                t_first = t_end
                if end.extra_tokens > 1:
                    ia(0.0)
                    iw(end.extra_tokens - 1)
            t_prev = t_end
            n += end.extra_tokens
        if end.error or not end.complete:
            raw.add_error(end.error or f"stream ended without its final record after {n} tokens")
            return
        raw.ok += 1
        raw.streamed_records += n
        tokens = n
        if end.reported_tokens is not None:
            if end.reported_tokens != n:
                raw.mismatches += 1
            tokens = end.reported_tokens
        raw.output_tokens += tokens
        raw.prompt_tokens += ptoks[i % nb]
        if n:
            ttft_a(t_first - t0)
            if n > 1:
                tpot_a((t_prev - t_first) / (n - 1))
        e2e_a(t_end - t0)

    async def worker(session, deadline: float | None, budget: int | None) -> None:
        while True:
            i = state["next"]
            if budget is not None and i - offset >= budget:
                return
            if deadline is not None and perf() >= deadline:
                return
            state["next"] = i + 1
            await one(session, i, True)

    async with aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        read_bufsize=1 << 18,
        skip_auto_headers=("User-Agent",),
    ) as session:
        if spec.warmup:
            warm = list(range(spec.warmup))
            sem = asyncio.Semaphore(conc)

            async def w(j):
                async with sem:
                    await one(session, j + 7919, False)

            await asyncio.gather(*(w(j) for j in warm))
            junk.clear()
        if barrier is not None:
            await asyncio.get_running_loop().run_in_executor(None, barrier.wait)
        pid = spec.server_pid
        raw.server_cpu0 = proc_cpu_seconds(pid) if pid else None
        cpu0 = time.process_time()
        raw.t_start = perf()
        deadline = raw.t_start + spec.duration if spec.duration else None
        await asyncio.gather(*(worker(session, deadline, spec.requests) for _ in range(conc)))
        raw.t_end = perf()
        raw.client_cpu_s = time.process_time() - cpu0
        raw.server_cpu1 = proc_cpu_seconds(pid) if pid else None
    return raw


def _child_level(spec: LevelSpec, wl: Workload, offset: int, barrier, queue) -> None:
    try:
        _install_loop(spec.loop)
        raw = asyncio.run(_run_level_async(spec, wl, offset, barrier))
        queue.put(("ok", raw))
    except BaseException as e:  # pragma: no cover - reported by the parent
        try:
            barrier.abort()
        except Exception:
            pass
        queue.put(("err", f"{type(e).__name__}: {e}"))


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def run_level(spec: LevelSpec, wl: Workload, client_procs: int = 1, client_cpus: list[int] | None = None) -> RawLevel:
    """Run one concurrency level; with ``client_procs > 1`` the load is split across processes
    (each with its own connector), started together, and the samples merged."""
    procs = max(1, min(client_procs, spec.concurrency))
    if procs == 1:
        _install_loop(spec.loop)
        raw = asyncio.run(_run_level_async(spec, wl))
        raw.client_procs = 1
        return raw
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs)
    queue = ctx.Queue()
    concs = _split(spec.concurrency, procs)
    reqs = _split(spec.requests, procs) if spec.requests is not None else [None] * procs
    warms = _split(spec.warmup, procs)
    children = []
    offset = 0
    for k in range(procs):
        sub = LevelSpec(spec.url, concs[k], reqs[k], spec.duration, warms[k], spec.timeout, spec.loop, spec.server_pid)
        p = ctx.Process(target=_child_level, args=(sub, wl, offset, barrier, queue), daemon=True)
        p.start()
        if client_cpus:
            try:
                os.sched_setaffinity(p.pid, {client_cpus[k % len(client_cpus)]})
            except OSError:
                pass
        children.append(p)
        offset += 1_000_003
    merged = RawLevel()
    failures = []
    for _ in children:
        kind, payload = queue.get()
        if kind == "ok":
            merged.merge(payload)
        else:
            failures.append(payload)
    for p in children:
        p.join(timeout=30)
    if failures:
        raise RuntimeError("client process failed: " + "; ".join(failures))
    merged.client_procs = procs
    return merged


def level_result(spec: LevelSpec, raw: RawLevel) -> dict[str, Any]:
    dur = max(raw.t_end - raw.t_start, 1e-9) if raw.t_end else 0.0
    server_cpu_s = raw.server_cpu_s
    ms = 1000.0

    def scaled(d: dict) -> dict:
        return {k: (round(v * ms, 3) if isinstance(v, float) and k != "n" else v) for k, v in d.items()}

    total = raw.ok + raw.errors
    return {
        "concurrency": spec.concurrency,
        "requests": total,
        "ok": raw.ok,
        "errors": raw.errors,
        "error_samples": raw.error_samples,
        "duration_s": round(dur, 4),
        "requests_per_s": round(raw.ok / dur, 3) if dur else 0.0,
        "output_tokens": raw.output_tokens,
        "output_tokens_per_s": round(raw.output_tokens / dur, 1) if dur else 0.0,
        "streamed_records": raw.streamed_records,
        "streamed_records_per_s": round(raw.streamed_records / dur, 1) if dur else 0.0,
        "token_count_mismatches": raw.mismatches,
        "prompt_tokens": raw.prompt_tokens,
        "ttft_ms": scaled(summarize(raw.ttft)),
        "itl_ms": scaled(weighted_summary(raw.itl, raw.itl_w)),
        "tpot_ms": scaled(summarize(raw.tpot)),
        "e2e_ms": scaled(summarize(raw.e2e)),
        "client_procs": raw.client_procs,
        "client_cpu_cores": round(raw.client_cpu_s / dur, 3) if dur else None,
        "server_cpu_cores": round(server_cpu_s / dur, 3) if (dur and server_cpu_s is not None) else None,
    }


# ---------------------------------------------------------------------------------------------
# Servers we start and watch


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_cpus(text: str | None) -> list[int] | None:
    """'0', '0,2', '1-3' → a list of CPU ids; None or '' → None."""
    if not text:
        return None
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        a, sep, b = part.partition("-")
        out.extend(range(int(a), int(b) + 1) if sep else [int(a)])
    return out


def default_pinning() -> tuple[list[int] | None, list[int] | None]:
    """(server cpus, client cpus): the first allowed CPU for the server, the rest for the client;
    (None, None) when there are fewer than two CPUs or no taskset."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None, None
    if len(allowed) < 2 or not _which("taskset"):
        return None, None
    return allowed[:1], allowed[1:]


def _which(name: str) -> str | None:
    from shutil import which

    return which(name)


def proc_cpu_seconds(pid: int) -> float | None:
    """utime+stime of a process and (recursively) its live children, from /proc; None if unknown."""
    try:
        tick = os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        return None
    seen: set[int] = set()

    def one(p: int) -> float:
        if p in seen:
            return 0.0
        seen.add(p)
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return 0.0
        fields = stat[stat.rfind(b")") + 2 :].split()
        total = (int(fields[11]) + int(fields[12])) / tick
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children", "rb") as f:
                    for child in f.read().split():
                        total += one(int(child))
        except OSError:
            pass
        return total

    if not os.path.exists(f"/proc/{pid}/stat"):
        return None
    return one(pid)


class ServerProcess:
    """A server subprocess: started (optionally pinned with taskset), ready when GET /ping
    answers 200, stopped with SIGINT then SIGTERM then SIGKILL."""

    def __init__(
        self,
        argv: list[str],
        port: int,
        *,
        cpus: list[int] | None = None,
        name: str = "server",
        log_path: str | os.PathLike | None = None,
        env: dict[str, str] | None = None,
        ready_path: str = "/ping",
    ):
        self.argv = list(argv)
        if cpus:
            self.argv = ["taskset", "-c", ",".join(map(str, cpus))] + self.argv
        self.port = port
        self.name = name
        self.url = f"http://127.0.0.1:{port}"
        self.ready_path = ready_path
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self) -> ServerProcess:
        if self.log_path:
            self._log = open(self.log_path, "wb")
            out = self._log
        else:
            out = subprocess.DEVNULL
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def wait_ready(self, timeout: float = 300.0) -> None:
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with code {self.proc.returncode} before it was ready" + self._log_hint()
                )
            try:
                with urllib.request.urlopen(self.url + self.ready_path, timeout=5) as r:
                    if r.status == 200:
                        return
                    last = f"HTTP {r.status}"
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}"
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            time.sleep(0.2)
        raise TimeoutError(
            f"{self.name} not ready at {self.url}{self.ready_path} after {timeout:.0f}s ({last})" + self._log_hint()
        )

    def _log_hint(self) -> str:
        if not self.log_path:
            return ""
        try:
            tail = Path(self.log_path).read_text(errors="replace")[-2000:]
        except OSError:
            return ""
        return f"; log {self.log_path}:\n{tail}"

    def cpu_seconds(self) -> float | None:
        return proc_cpu_seconds(self.proc.pid) if self.proc and self.proc.poll() is None else None

    def stop(self, grace: float = 10.0) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(p.pid, sig)  # its own session: reaches taskset's child and workers
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self._log:
            self._log.close()
            self._log = None

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_argv(serve_args: str, port: int, serve_cmd: str | None = None) -> list[str]:
    """`python -m lmi_trt serve ARGS --port P` (a --port already in ARGS wins); ``serve_cmd``
    replaces `python -m lmi_trt serve`, e.g. "lmi-trt serve" for an installed entry point."""
    args = shlex.split(serve_args)
    if args and args[0] == "serve":
        args = args[1:]
    if not any(a == "--port" or a.startswith("--port=") for a in args):
        args += ["--port", str(port)]
    prefix = shlex.split(serve_cmd) if serve_cmd else [sys.executable, "-m", "lmi_trt", "serve"]
    return [*prefix, *args]


def port_of(argv: list[str], default: int) -> int:
    for i, a in enumerate(argv):
        if a == "--port" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--port="):
            return int(a.split("=", 1)[1])
    return default


def openai_model_name(url: str, default: str = "model") -> str:
    import urllib.request

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=10) as r:
            data = json.loads(r.read())
        return data["data"][0]["id"]
    except Exception:
        return default


# ---------------------------------------------------------------------------------------------
# Running a series of levels, reporting


@dataclass
class BenchConfig:
    api: str = "lmi"
    concurrency: list[int] = field(default_factory=lambda: [16])
    requests: int | None = None
    duration: float | None = None
    warmup: int | None = None  # None: one request per connection (= concurrency)
    prompt: LengthDist = LengthDist(128, 128)
    output: LengthDist = LengthDist(128, 128)
    tokenizer: str | None = None
    openai_endpoint: str = "completions"
    model: str | None = None
    ignore_eos: bool = False
    details: bool = False
    seed: int = 0
    timeout: float = 600.0
    client_procs: int = 1
    client_cpus: list[int] | None = None
    loop: str = "auto"

    def requests_for(self, concurrency: int) -> int | None:
        if self.requests is not None:
            return self.requests
        if self.duration is not None:
            return None
        return max(32, 8 * concurrency)

    def workload(self, model: str) -> Workload:
        most = max(self.requests_for(c) or 512 for c in self.concurrency)
        return build_workload(
            self.api,
            self.prompt,
            self.output,
            n=min(most, 512),
            seed=self.seed,
            tokenizer_dir=self.tokenizer,
            openai_endpoint=self.openai_endpoint,
            model=model,
            ignore_eos=self.ignore_eos,
            details=self.details,
        )


def run_series(
    url: str, cfg: BenchConfig, wl: Workload, concurrency: int, server_pid: int | None = None
) -> dict[str, Any]:
    """One level against one server: the result dict (see level_result)."""
    warmup = concurrency if cfg.warmup is None else cfg.warmup
    spec = LevelSpec(
        url, concurrency, cfg.requests_for(concurrency), cfg.duration, warmup, cfg.timeout, cfg.loop, server_pid
    )
    return level_result(spec, run_level(spec, wl, cfg.client_procs, cfg.client_cpus))


def _fmt(v, nd=1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def format_table(levels: list[dict[str, Any]]) -> str:
    head = [
        "conc",
        "reqs",
        "err",
        "req/s",
        "out tok/s",
        "TTFT p50/p90/p99 ms",
        "ITL p50/p90/p99 ms",
        "TPOT p50 ms",
        "cli cpu",
        "srv cpu",
    ]
    rows = [head]
    for r in levels:
        t, i = r["ttft_ms"], r["itl_ms"]
        rows.append(
            [
                str(r["concurrency"]),
                _fmt(r["requests"]),
                _fmt(r["errors"]),
                _fmt(r["requests_per_s"]),
                _fmt(r["output_tokens_per_s"]),
                "/".join(_fmt(t[f"p{q}"]) for q in PERCENTILES),
                "/".join(_fmt(i[f"p{q}"], 2) for q in PERCENTILES),
                _fmt(r["tpot_ms"]["p50"], 2),
                _fmt(r["client_cpu_cores"], 2),
                _fmt(r["server_cpu_cores"], 2),
            ]
        )
    return _render(rows)


def _render(rows: list[list[str]]) -> str:
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def first_level_failed(level: dict[str, Any]) -> str:
    """One line for a first level whose every request failed: the server's first answer and what to change."""
    first = next(iter(level["error_samples"]), "no answer")
    hint = (
        " (--prompt-tokens and --output-tokens size the requests: keep them within the server's "
        "option.max_input_len and option.max_output_len)"
        if first.startswith("HTTP 400")
        else ""
    )
    return (
        f"every request of the first level (concurrency {level['concurrency']}, {level['errors']} requests) failed, "
        f"so no other level was run; the first answer: {first}{hint}"
    )


def client_warnings(levels: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in levels:
        cores = r.get("client_cpu_cores")
        procs = r.get("client_procs") or 1
        if cores is not None and cores / procs > 0.85:
            out.append(
                f"concurrency {r['concurrency']}: the client used {cores:.2f} CPU core(s) over {procs} "
                f"process(es); it may be what limits this level (try --client-procs {procs * 2})"
            )
        if r["errors"]:
            samples = "; ".join(f"{k} (x{v})" for k, v in list(r["error_samples"].items())[:3])
            out.append(f"concurrency {r['concurrency']}: {r['errors']} failed request(s): {samples}")
        mismatches = r.get("token_count_mismatches")
        if mismatches:
            fewer = r["streamed_records"] < r["output_tokens"]
            why = (
                "fewer records than tokens: the server sent several tokens in one record (a token ending inside a "
                "UTF-8 character is held back and sent with the next, and a server that falls behind merges tokens)"
                if fewer
                else "more records than tokens: the server sent records that carry no new token"
            )
            out.append(
                f"concurrency {r['concurrency']}: in {mismatches} of {r['ok']} streams the records counted differ "
                f"from the server's own token count (details.generated_tokens / usage.completion_tokens), {why}; "
                "tokens/s uses the server's count, ITL and TPOT the records"
            )
    return out


def plot_throughput(
    path: str | os.PathLike,
    series: dict[str, list[dict[str, Any]]],
    title: str = "",
    ratio_of: tuple[str, str] | None = None,
) -> None:
    """Output tokens/s vs concurrency, one line per series (matplotlib, Agg backend).
    ``ratio_of=(num, den)`` adds num/den on a second axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.6))
    for name, levels in series.items():
        xs = [r["concurrency"] for r in levels]
        ys = [r["output_tokens_per_s"] for r in levels]
        ax.plot(xs, ys, marker="o", label=name)
    ax.set_xscale("log", base=2)
    ticks = sorted({r["concurrency"] for levels in series.values() for r in levels})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("output tokens/s")
    ax.grid(True, which="both", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if ratio_of and all(k in series for k in ratio_of):
        num = {r["concurrency"]: r["output_tokens_per_s"] for r in series[ratio_of[0]]}
        den = {r["concurrency"]: r["output_tokens_per_s"] for r in series[ratio_of[1]]}
        xs = sorted(c for c in num if c in den and den[c])
        ax2 = ax.twinx()
        ax2.plot(
            xs,
            [num[c] / den[c] for c in xs],
            color="gray",
            linestyle="--",
            marker="x",
            label=f"{ratio_of[0]} / {ratio_of[1]}",
        )
        ax2.set_ylabel("ratio")
        ax2.set_ylim(0, max(1.05, max((num[c] / den[c] for c in xs), default=1) * 1.1))
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8, frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def machine_facts() -> dict[str, Any]:
    import platform

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    try:
        import aiohttp

        aiohttp_version = aiohttp.__version__
    except ImportError:  # pragma: no cover
        aiohttp_version = None
    return {
        "host": platform.node(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "client_affinity": affinity,
        "python": platform.python_version(),
        "aiohttp": aiohttp_version,
        "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def write_json(path: str | os.PathLike, doc: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(doc, indent=2, default=str) + "\n")


# ---------------------------------------------------------------------------------------------
# CLI


def parse_concurrency(text: str) -> list[int]:
    try:
        out = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or N,N,... got {text!r}") from None
    if not out or any(c < 1 for c in out):
        raise argparse.ArgumentTypeError(f"concurrency values must be >= 1, got {text!r}")
    return out


def _dist(text: str) -> LengthDist:
    try:
        return LengthDist.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_load_arguments(p: argparse.ArgumentParser) -> None:
    """Load-shape flags shared by `lmi-trt bench` and benchmarks/compare.py."""
    g = p.add_argument_group("load")
    g.add_argument(
        "--api",
        choices=APIS,
        default="lmi",
        help="lmi: POST /invocations jsonlines; openai: /v1/completions SSE; tgi: /generate_stream SSE",
    )
    g.add_argument(
        "--openai-endpoint",
        choices=OPENAI_ENDPOINTS,
        default="completions",
        help="with --api openai: /v1/completions or /v1/chat/completions",
    )
    g.add_argument("--model", help="OpenAI 'model' field (default: the first of GET /v1/models, else 'model')")
    g.add_argument(
        "-c",
        "--concurrency",
        type=parse_concurrency,
        default=parse_concurrency(DEFAULT_CONCURRENCY),
        help=f"concurrent streams: one value or a list (default {DEFAULT_CONCURRENCY})",
    )
    g.add_argument(
        "-n", "--requests", type=int, help="requests per level (default: max(32, 8 x concurrency) unless --duration)"
    )
    g.add_argument("-d", "--duration", type=float, help="seconds per level: no new requests after it")
    g.add_argument(
        "--warmup",
        type=int,
        help="unmeasured requests per level before it (default: the concurrency, which also opens "
        "the connections; 0: none)",
    )
    g.add_argument(
        "--prompt-tokens",
        type=_dist,
        default=LengthDist(128, 128),
        help="prompt length: N or LO:HI uniform (default 128; approximate without --tokenizer)",
    )
    g.add_argument(
        "--output-tokens",
        type=_dist,
        default=LengthDist(128, 128),
        help="max_new_tokens: N or LO:HI uniform (default 128)",
    )
    g.add_argument("--tokenizer", help="a tokenizer folder: prompts of exactly --prompt-tokens tokens")
    g.add_argument("--ignore-eos", action="store_true", help="send ignore_eos=true so outputs run to max_new_tokens")
    g.add_argument(
        "--details",
        action="store_true",
        help="LMI/TGI: ask for details, so details.generated_tokens confirms the count",
    )
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--timeout", type=float, default=600.0, help="per-request limit, seconds (default 600)")
    c = p.add_argument_group("client")
    c.add_argument(
        "--client-procs",
        type=int,
        default=1,
        help="client processes sharing the load (default 1); raise it when the client's CPU use nears 1.0",
    )
    c.add_argument("--client-cpus", help="CPUs to pin the client process(es) to, e.g. 1 or 1-3")
    c.add_argument(
        "--loop",
        choices=("auto", "asyncio", "uvloop"),
        default="auto",
        help="client event loop (auto: uvloop when installed)",
    )


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    return BenchConfig(
        api=args.api,
        concurrency=args.concurrency,
        requests=args.requests,
        duration=args.duration,
        warmup=args.warmup,
        prompt=args.prompt_tokens,
        output=args.output_tokens,
        tokenizer=args.tokenizer,
        openai_endpoint=args.openai_endpoint,
        model=args.model,
        ignore_eos=args.ignore_eos,
        details=args.details,
        seed=args.seed,
        timeout=args.timeout,
        client_procs=args.client_procs,
        client_cpus=parse_cpus(args.client_cpus),
        loop=args.loop,
    )


def configure_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    t = p.add_argument_group("target (one of)")
    x = t.add_mutually_exclusive_group(required=True)
    x.add_argument("--url", help="a running server, e.g. http://127.0.0.1:8080")
    x.add_argument(
        "--serve-args",
        metavar="ARGS",
        help="start `python -m lmi_trt serve ARGS` (on a free port unless ARGS has --port), "
        "wait for /ping 200, stop it at the end",
    )
    t.add_argument("--serve-cmd", help="with --serve-args: the command instead of `python -m lmi_trt serve`")
    t.add_argument("--server-cpus", help="with --serve-args: pin the server with taskset, e.g. 0")
    t.add_argument("--server-pid", type=int, help="with --url: sample this process's CPU use per level")
    t.add_argument("--start-timeout", type=float, default=300.0, help="seconds to wait for /ping 200 (default 300)")
    t.add_argument("--server-log", help="with --serve-args: write the server's output here")
    add_load_arguments(p)
    o = p.add_argument_group("output")
    o.add_argument("--json", metavar="FILE", help="write machine-readable results")
    o.add_argument("--plot", metavar="FILE.png", help="plot output tokens/s vs concurrency (needs matplotlib)")
    o.add_argument("--label", default="lmi-trt", help="series name in the JSON and plot")
    p.set_defaults(func=cmd_bench)
    return p


def add_subcommand(subparsers) -> argparse.ArgumentParser:
    """Register `bench` on the `lmi-trt` sub-parsers (lmi_trt/cli/__init__.py calls this)."""
    p = subparsers.add_parser(
        "bench",
        help="streaming load generator: tokens/s, TTFT, ITL vs concurrency (LMI, OpenAI or TGI routes)",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    return configure_parser(p)


def cmd_bench(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # before the run, not after it
        print(
            f'error: --plot {args.plot} needs matplotlib, which is not installed: pip install "matplotlib>=3.8" '
            "(or the development install), or leave --plot out",
            file=sys.stderr,
        )
        return 2
    if cfg.client_cpus:
        try:
            os.sched_setaffinity(0, set(cfg.client_cpus))
        except OSError as e:
            print(f"warning: could not pin the client to {cfg.client_cpus}: {e}", file=sys.stderr)
    server: ServerProcess | None = None
    server_pid = args.server_pid
    try:
        if args.serve_args:
            argv = serve_argv(args.serve_args, free_port(), args.serve_cmd)
            server = ServerProcess(
                argv,
                port_of(argv, 8080),
                cpus=parse_cpus(args.server_cpus),
                name="lmi-trt serve",
                log_path=args.server_log,
            )
            print(f"starting: {shlex.join(server.argv)}", file=sys.stderr)
            server.start()
            server.wait_ready(args.start_timeout)
            url = server.url
            server_pid = server.pid
        else:
            url = args.url.rstrip("/")
        model = cfg.model or (openai_model_name(url) if cfg.api == "openai" else "model")
        wl = cfg.workload(model)
        levels = []
        for conc in cfg.concurrency:
            res = run_series(url, cfg, wl, conc, server_pid)
            levels.append(res)
            if len(levels) == 1 and res["ok"] == 0 and res["errors"]:  # the others would fail alike: say why, once
                print(f"error: {first_level_failed(res)}", file=sys.stderr)
                break
            print(
                f"  concurrency {conc}: {res['output_tokens_per_s']:,.0f} tok/s, {res['requests_per_s']:.1f} req/s, "
                f"{res['errors']} errors",
                file=sys.stderr,
                flush=True,
            )
    finally:
        if server is not None:
            server.stop()
    stopped = len(levels) < len(cfg.concurrency)
    if not stopped:
        print(format_table(levels))
        for w in client_warnings(levels):
            print("note: " + w)
    if args.json:
        write_json(
            args.json,
            {
                "kind": "lmi-trt-bench",
                "label": args.label,
                "url": url,
                "server": shlex.join(server.argv) if server else None,
                "config": _config_doc(cfg, wl),
                "machine": machine_facts(),
                "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "levels": levels,
            },
        )
    if args.plot and not stopped:
        plot_throughput(
            args.plot,
            {args.label: levels},
            title=f"{cfg.api} stream, prompt {wl.prompt_dist} / output {wl.output_dist} tokens",
        )
    return 1 if any(r["ok"] == 0 for r in levels) else 0


def _config_doc(cfg: BenchConfig, wl: Workload) -> dict[str, Any]:
    return {
        "api": cfg.api,
        "path": wl.path,
        "concurrency": cfg.concurrency,
        "requests_per_level": {c: cfg.requests_for(c) for c in cfg.concurrency},
        "duration_s": cfg.duration,
        "warmup": "concurrency" if cfg.warmup is None else cfg.warmup,
        "prompt_tokens": wl.prompt_dist,
        "prompt_tokens_exact": wl.prompt_tokens_exact,
        "output_tokens": wl.output_dist,
        "ignore_eos": cfg.ignore_eos,
        "details": cfg.details,
        "client_procs": cfg.client_procs,
        "client_cpus": cfg.client_cpus,
        "loop": cfg.loop,
        "seed": cfg.seed,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="lmi-trt bench",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    configure_parser(p)
    args = p.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
