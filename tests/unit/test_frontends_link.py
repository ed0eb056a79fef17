"""The engine's process and its front ends (option.api_server_count): how many, the shared admission count, and the
link between a real synthetic engine and a RemoteEngine in this process (the Unix sockets the processes use)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import pickle

import pytest
from serverproc import synthetic_engine, tiny_tokenizer, wait_until

from lmi_trt.config import LmiConfig
from lmi_trt.engines.base import Beam, EngineOutput, EngineStats, FinishReason, GenerationRequest, SamplingParams
from lmi_trt.serving.admission import LocalAdmission, SharedAdmission
from lmi_trt.serving.core import LoadedModel
from lmi_trt.serving.engine_link import (
    EngineServer,
    Frames,
    RemoteEngine,
    _encode_outputs,
    _unwire,
    _wire,
    frame,
    read_message,
)
from lmi_trt.serving.frontends import frontend_config, frontend_count


def test_frontend_count_follows_the_option_then_the_cores():
    assert frontend_count(3, 2) == 3
    assert [frontend_count(None, cores) for cores in (1, 2, 4, 7, 8, 16, 32, 64)] == [1, 1, 1, 1, 2, 4, 8, 8]


def test_each_front_end_gets_its_share_of_the_per_process_bounds():
    config = frontend_config(LmiConfig(max_connections=1000, max_upload_bytes=1000), 3)
    assert (config.max_connections, config.max_upload_bytes) == (333, 333)


def test_shared_admission_counts_every_front_end_and_never_overshoots():
    slots = [0, 0]
    a, b = SharedAdmission(slots, 0), SharedAdmission(slots, 1)
    assert a.take(1, 2) and b.take(1, 2)
    assert not a.take(1, 2) and not b.take(1, 2)
    assert slots == [1, 1] and a.total() == 2
    b.add(-1)
    assert a.take(1, 2) and slots == [2, 0]
    local = LocalAdmission()
    assert local.take(2, 2) and not local.take(1, 2) and local.total() == 2


def test_an_output_crosses_the_wire_unchanged():
    out = EngineOutput(
        "r1",
        [5, 6],
        logprobs=[-0.5, -1.0],
        top_logprobs=[[(5, -0.5)], [(6, -1.0)]],
        finished=True,
        finish_reason=FinishReason.LENGTH,
        queue_time_s=0.25,
    )
    assert _unwire(_wire(out)) == out
    refused = EngineOutput(
        "r5", [], prompt_logprobs=[None, -1.5], finished=True, error="no", error_code=400, error_field="guided"
    )
    plain = EngineOutput("r2", [1])
    assert _unwire(_wire(plain)) == plain
    # An outputs message (marshal's, the engine's figures pickled beside) and one marshal cannot write (pickle's).
    stats = EngineStats(active_requests=3, total_generated_tokens=7)
    beams = EngineOutput("r3", [1], finished=True, finish_reason=FinishReason.EOS, beams=[Beam([1], FinishReason.EOS)])
    for outs, pickled in (([_wire(out), ("r4", [7, 8], None), _wire(refused)], False), ([_wire(beams)], True)):
        payload = _encode_outputs(outs, stats)
        assert payload.startswith(pickle.PROTO) is pickled
        kind, wired, figures = read_message(payload)
        assert (kind, figures) == ("outs", stats) and [_unwire(t) for t in wired] == [_unwire(t) for t in outs]


def _request(rid: str, n: int) -> GenerationRequest:
    return GenerationRequest(rid, [11, 12, 13], SamplingParams(max_new_tokens=n))


@contextlib.asynccontextmanager
async def _linked(tmp_path, engine, fronts: int = 1):
    """An EngineServer and ``fronts`` RemoteEngines connecting to it (their ``connect()`` tasks); all closed after."""
    if engine is not None:
        await engine.start()
    server = EngineServer(f"{tmp_path}/engine")
    await server.start()
    remotes = [RemoteEngine(server.address, f"fe-{i}", os.getppid()) for i in range(fronts)]
    connecting = [asyncio.ensure_future(r.connect()) for r in remotes]
    try:
        yield server, remotes, connecting
    finally:
        for remote in remotes:
            await remote.close()
        await server.close()
        if engine is not None:
            await engine.close()


@pytest.mark.parametrize("cancel", [False, True])
def test_a_remote_engine_streams_what_the_engine_does_and_cancels_it(tmp_path, cancel):
    async def main() -> None:
        engine = synthetic_engine(tiny_tokenizer(), tokens_per_second=None if not cancel else 50.0)
        async with _linked(tmp_path, engine) as (server, [remote], [connecting]):
            await asyncio.sleep(0.2)
            assert not connecting.done()  # loading: the front end waits
            server.ready(engine, None)
            state = await asyncio.wait_for(connecting, 10)
            assert state.phase == "ready" and remote.limits == engine.limits and remote.name == engine.name

            direct = [o async for o in engine.submit(_request("direct", 8))]
            if not cancel:
                remote_outs = [o async for o in remote.submit(_request("via-link", 8))]
                assert [t for o in remote_outs for t in o.token_ids] == [t for o in direct for t in o.token_ids]
                assert remote_outs[-1].finished and remote_outs[-1].finish_reason is FinishReason.LENGTH
            else:
                stream = remote.submit(_request("left", 400))
                first = await stream.__anext__()
                assert first.token_ids
                await stream.aclose()  # the client left: the engine frees the slot
                await _slots_freed(engine, server)

    asyncio.run(main())


def test_a_failed_load_reaches_the_front_end(tmp_path):
    async def main() -> None:
        async with _linked(tmp_path, None) as (server, [remote], [connecting]):
            await asyncio.sleep(0.1)
            server.failed("option.model_id=x: no such folder")
            state = await asyncio.wait_for(connecting, 10)
            assert state.phase == "failed" and state.error == "option.model_id=x: no such folder"
            assert not remote.healthy
            out = [o async for o in remote.submit(_request("late", 2))]
            assert out[-1].error_code == 503

    asyncio.run(main())


def test_an_unhealthy_engine_turns_the_front_end_unhealthy(tmp_path):
    async def main() -> None:
        engine = synthetic_engine(tiny_tokenizer())
        async with _linked(tmp_path, engine) as (server, [remote], [connecting]):
            server.ready(engine, None)
            await asyncio.wait_for(connecting, 10)
            assert remote.healthy
            engine.fail("a CUDA error")
            for _ in range(100):
                if not remote.healthy:
                    break
                await asyncio.sleep(0.05)
            assert not remote.healthy

    asyncio.run(main())


def test_two_front_ends_may_send_the_same_request_id(tmp_path):
    """X-Request-Id comes from the client, and each front end counts from 1: the engine must keep them apart."""

    async def main() -> None:
        engine = synthetic_engine(tiny_tokenizer(), tokens_per_second=200.0)
        async with _linked(tmp_path, engine, fronts=2) as (server, remotes, connecting):
            server.ready(engine, None)
            await asyncio.wait_for(asyncio.gather(*connecting), 10)
            requests = [
                GenerationRequest("same-1", [11, 12, 13], SamplingParams(max_new_tokens=6)),
                GenerationRequest("same-1", [21, 22], SamplingParams(max_new_tokens=9)),
            ]
            runs = await asyncio.gather(*(_collect(r.submit(q)) for r, q in zip(remotes, requests)))
            for outs, request in zip(runs, requests):
                assert all(o.request_id == "same-1" for o in outs)
                assert sum(len(o.token_ids) for o in outs) == request.sampling.max_new_tokens
                assert outs[-1].finish_reason is FinishReason.LENGTH

    asyncio.run(main())


async def _slots_freed(engine, server) -> None:
    for _ in range(200):
        if engine.stats().active_requests == 0 and server.in_flight == 0:
            break
        await asyncio.sleep(0.05)
    assert engine.stats().active_requests == 0 and server.in_flight == 0


async def _collect(stream) -> list[EngineOutput]:
    return [o async for o in stream]


class _RawFrontEnd:
    """A front end that is only a socket speaking the link's messages: the test decides when it acknowledges outputs
    (never, at first)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.frames = Frames()
        self.messages: collections.deque[bytes] = collections.deque()

    async def send(self, message: tuple) -> None:
        self.writer.write(frame(pickle.dumps(message)))
        await self.writer.drain()

    async def recv(self, timeout: float = 10) -> tuple:
        while not self.messages:
            data = await asyncio.wait_for(self.reader.read(1 << 16), timeout)
            assert data, "the engine closed the link"
            self.messages.extend(self.frames.feed(data))
        return read_message(self.messages.popleft())

    async def arrived(self, within: float) -> list[tuple]:
        """Every message that arrives within ``within`` seconds."""
        messages, loop = [], asyncio.get_running_loop()
        deadline = loop.time() + within
        with contextlib.suppress(asyncio.TimeoutError):
            while (left := deadline - loop.time()) > 0:
                messages.append(await self.recv(left))
        return messages


@contextlib.asynccontextmanager
async def _raw_front_end(server, name: str):
    reader, writer = await asyncio.open_unix_connection(server.address)
    front = _RawFrontEnd(reader, writer)
    try:
        await front.send(("hello", name))
        assert (await front.recv())[0] == "state"
        yield front
    finally:
        writer.close()


async def _tokens_until_the_window_is_full(front: _RawFrontEnd) -> None:
    from lmi_trt.serving.engine_link import WINDOW

    for _ in range(WINDOW):
        assert (await front.recv())[0] == "outs"
    # the heartbeat's state, no outputs until acknowledged
    assert {message[0] for message in await front.arrived(0.3)} <= {"state"}


def test_the_engine_waits_for_a_front_end_that_falls_behind(tmp_path):
    """At most WINDOW outputs messages go to a front end that has not acknowledged them: the unpaced synthetic engine
    (as fast as its consumers take them) then waits, instead of filling the socket with steps that every later
    token would queue behind."""

    from lmi_trt.serving.engine_link import WINDOW

    async def main() -> None:
        engine = synthetic_engine(tiny_tokenizer(), tokens_per_second=None)
        async with _linked(tmp_path, engine, fronts=0) as (server, _, _):
            server.ready(engine, None)
            async with _raw_front_end(server, "fe-slow") as front:
                await front.send(("submit", _request("long", 1000)))
                await _tokens_until_the_window_is_full(front)
                assert engine.stats().total_generated_tokens <= WINDOW + 1
                await front.send(("ack", WINDOW))
                message = ("state",)
                while message[0] == "state":
                    message = await front.recv()
                assert message[0] == "outs" and message[1][0][0] == "long"

    asyncio.run(main())


def test_a_front_end_that_falls_behind_holds_back_its_own_requests_only(tmp_path):
    """The unpaced synthetic engine steps each request at its own front end's pace: a front end that stopped
    acknowledging does not stall another's requests (paced by the slowest, N front ends served as one)."""

    from lmi_trt.serving.engine_link import WINDOW

    async def main() -> None:
        engine = synthetic_engine(tiny_tokenizer(), tokens_per_second=None)
        async with _linked(tmp_path, engine) as (server, [remote], [connecting]):
            server.ready(engine, None)
            await asyncio.wait_for(connecting, 10)
            async with _raw_front_end(server, "fe-slow") as front:
                await front.send(("submit", _request("stalled", 1000)))
                await _tokens_until_the_window_is_full(front)
                outs = await asyncio.wait_for(_collect(remote.submit(_request("served", 300))), 30)
                assert sum(len(o.token_ids) for o in outs) == 300 and outs[-1].finished
                assert engine.stats().total_generated_tokens <= 300 + WINDOW + 1

    asyncio.run(main())


def test_messages_are_read_whole_however_the_reads_split_them():
    payloads = [b"", b"a", bytes(range(256)) * 300]
    stream = b"".join(frame(p) for p in payloads)
    for size in (1, 3, 7, 4096, len(stream)):
        frames = Frames()
        read = [m for i in range(0, len(stream), size) for m in frames.feed(stream[i : i + size])]
        assert read == payloads


def test_a_front_end_whose_socket_closes_has_its_requests_cancelled(tmp_path):
    """A front end that dies mid-stream closes its socket (the kernel does): the engine frees its requests' slots at
    once, before any supervisor says so."""

    async def main() -> None:
        engine = synthetic_engine(tiny_tokenizer(), tokens_per_second=50)
        async with _linked(tmp_path, engine, fronts=0) as (server, _, _):
            server.ready(engine, None)
            async with _raw_front_end(server, "fe-dies") as front:
                await front.send(("submit", _request("orphan", 1000)))
                assert (await front.recv())[0] in ("outs", "state")
                assert server.in_flight == 1
            await _slots_freed(engine, server)

    asyncio.run(main())


def test_a_batch_takes_its_room_under_job_queue_size_at_once(tmp_path):
    """Two batches admitted together on two front ends must not both fit where only one does: each takes all of
    its room in one atomic step, and what it does not use goes back."""
    from lmi_trt.serving.core import GenerateParams, GenerationService
    from lmi_trt.serving.errors import ServiceUnavailable

    async def main() -> None:
        tok = tiny_tokenizer()
        engine = synthetic_engine(tok, max_new_tokens=8)
        await engine.start()
        slots = [0, 3]  # the other front end holds 3 of job_queue_size=5
        service = GenerationService(engine, tok, LmiConfig(job_queue_size=5), admission=SharedAdmission(slots, 0))
        with pytest.raises(ServiceUnavailable):
            service.admit_batch(3, "inputs")
        assert slots == [0, 3]
        with service.admit_batch(2, "inputs") as reservation:
            assert slots == [2, 3]  # counted before any prompt starts: a batch elsewhere sees it at once
            stream = await service.start("hi", GenerateParams(max_new_tokens=2), admitted=reservation)
        assert slots == [1, 3]  # the prompt that never started gave its room back
        await stream.collect()
        await stream.aclose()
        assert slots == [0, 3]
        await engine.close()

    asyncio.run(main())


def test_the_torch_engine_hands_its_steps_to_the_link(tmp_path):
    """TorchEngine as a BatchedEngine behind the link: a streamed request's tokens are the engine's own (no task per
    request), a request that needs _stream's work (prompt log-probs) is relayed whole, a cancel frees the slot."""
    from tinymodels import tiny_model

    from lmi_trt.engines.torch import TorchEngine

    async def main() -> None:
        engine = TorchEngine(tiny_model("llama"), max_batch_size=4, max_input_len=16, max_new_tokens=12)
        async with _linked(tmp_path, engine) as (server, [remote], [connecting]):
            server.ready(engine, None)
            await asyncio.wait_for(connecting, 60)
            direct = await _collect(engine.submit(_request("direct", 12)))
            linked = await _collect(remote.submit(_request("linked", 12)))
            assert [t for o in linked for t in o.token_ids] == [t for o in direct for t in o.token_ids]
            assert linked[-1].finish_reason is FinishReason.LENGTH and server.in_flight == 0
            scored = GenerationRequest("scored", [11, 12, 13], SamplingParams(max_new_tokens=3, prompt_logprobs=1))
            outs = await _collect(remote.submit(scored))
            assert outs[0].prompt_logprobs is not None and len(outs[0].prompt_logprobs) == 3
            assert sum(len(o.token_ids) for o in outs) == 3
            refused = await _collect(remote.submit(GenerationRequest("long", list(range(40)), SamplingParams())))
            assert refused[-1].error_code == 400
            stream = remote.submit(_request("left", 12))
            await stream.__anext__()
            await stream.aclose()
            await _slots_freed(engine, server)

    asyncio.run(main())


def _synthetic_app(**build: object) -> tuple:
    """An app over a synthetic engine (loaded in the background once served, as `lmi-trt serve` loads), ``build``
    passed to ``build_app``, and a listening socket for ``serve``."""
    from lmi_trt.serving.app import build_app, listen

    tok = tiny_tokenizer()
    engine = synthetic_engine(tok, max_new_tokens=8)

    async def load() -> LoadedModel:
        await engine.start()
        return LoadedModel(engine, tok)

    return build_app(load, LmiConfig(), model_name="tiny", **build), listen("127.0.0.1", 0)


def test_ping_is_pending_until_every_front_end_serves_alone_on_the_socket():
    """Front end 0 runs the real ``app.serve`` (its health responder, then its listener) on a socket; front end 1 is
    driven by hand through the same shared flags. Loaded, front end 0 serves requests at once, but its /ping stays
    503 PENDING while front end 1 may still have a health responder answering "still loading" on the socket; a
    replacement for front end 1 (the flags stay set) does not turn it back."""
    from aiohttp import ClientSession

    from lmi_trt.serving.app import serve
    from lmi_trt.serving.frontends import SharedReadiness

    async def main() -> None:
        loaded, serving = [0, 0], [0, 0]
        other = SharedReadiness(loaded, serving, 1)
        app, sock = _synthetic_app(readiness=SharedReadiness(loaded, serving, 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        stop = asyncio.Event()
        server = asyncio.ensure_future(serve(app, sock=sock, stop=stop, exit_on_failure_after=None))
        async with ClientSession(url) as s:
            await other.loaded()
            assert await wait_until(lambda: serving[0] == 1, timeout=60)  # front end 0 serves alone: no responder
            async with s.get("/ping") as r:
                assert (r.status, await r.json()) == (503, {"tiny": {"status": "PENDING"}})
            async with s.post("/invocations", json={"inputs": "hi", "parameters": {"max_new_tokens": 2}}) as r:
                assert r.status == 200, await r.text()
            other.serving()
            async with s.get("/ping") as r:
                assert (r.status, await r.json()) == (200, {"tiny": {"status": "Healthy"}})
            replacement = SharedReadiness(loaded, serving, 1)
            await replacement.loaded()
            async with s.get("/ping") as r:
                assert r.status == 200
        stop.set()
        assert await server == 0

    asyncio.run(main())


def test_ping_is_pending_until_the_health_responder_has_stopped_accepting(monkeypatch):
    """One process: loaded, the server accepts beside its health responder until the responder stops (a connection
    queued at the handover is answered by one of the two). While the responder may still take a connection and answer
    it "still loading", /ping stays 503: a client that saw 200 must not get "still loading" on its next request (CI
    caught it: test_launch_mpi's /invocations after /ping 200). The responder here stops accepting at once but its
    stop returns only when released, so every connection meanwhile reaches the server."""
    import threading

    from aiohttp import ClientSession

    from lmi_trt.serving.app import serve
    from lmi_trt.serving.health_responder import HealthResponder
    from lmi_trt.serving.http import CONTEXT, ModelStatus

    release, stopping = threading.Event(), threading.Event()
    real_stop = HealthResponder.stop

    def slow_stop(self: HealthResponder) -> None:
        real_stop(self)
        stopping.set()
        release.wait(60)

    monkeypatch.setattr(HealthResponder, "stop", slow_stop)

    async def main() -> None:
        app, sock = _synthetic_app()
        stop = asyncio.Event()
        server = asyncio.ensure_future(serve(app, sock=sock, stop=stop, exit_on_failure_after=None))
        async with ClientSession(f"http://127.0.0.1:{sock.getsockname()[1]}") as s:
            assert await wait_until(stopping.is_set, timeout=60)
            async with s.post("/invocations", json={"inputs": "hi", "parameters": {"max_new_tokens": 2}}) as r:
                assert r.status == 200, await r.text()  # the server answers: the model is loaded
            async with s.get("/ping") as r:
                assert (r.status, await r.json()) == (503, {"tiny": {"status": "PENDING"}})
            release.set()
            assert await wait_until(lambda: app[CONTEXT].status is ModelStatus.HEALTHY, timeout=60)
            async with s.get("/ping") as r:
                assert (r.status, await r.json()) == (200, {"tiny": {"status": "Healthy"}})
        stop.set()
        assert await server == 0

    asyncio.run(main())


def test_the_trtllm_executor_engine_hands_its_response_batches_to_the_link(tmp_path):
    """TrtllmEngine (the fake Executor) as a BatchedEngine behind the link, two front ends: each stream's tokens are
    the engine's own with no task per request in the engine's process, and a client that leaves cancels exactly its
    own Executor request while the other front end's stream runs on."""
    import threading

    from tinymodels import tiny_model
    from trtllm_testing import fake_tensorrt_llm, make_engine_dir

    resume = threading.Event()

    async def main() -> None:
        from lmi_trt.engines.trtllm import TrtllmEngine, TrtllmSettings

        engine_dir = make_engine_dir(tiny_model("llama"), tmp_path / "plans", max_batch_size=4, max_seq_len=160)
        engine = TrtllmEngine(
            engine_dir, TrtllmSettings(), eos_token_ids=[2], pad_token_id=0, gpu_available=lambda: True
        )
        async with _linked(tmp_path, engine, fronts=2) as (server, [one, two], connecting):
            server.ready(engine, None)
            await asyncio.wait_for(asyncio.gather(*connecting), 60)
            executor = engine._executor
            enqueued: list[int] = []
            cancelled: list[int] = []
            enqueue, cancel, responses_of = executor.enqueue_request, executor.cancel_request, executor.await_responses
            executor.enqueue_request = lambda request: enqueued.append(enqueue(request)) or enqueued[-1]
            executor.cancel_request = lambda exec_id: (cancelled.append(exec_id), cancel(exec_id))
            held = []

            def await_responses(**kwargs):
                # The pump stops after the batch with the leaving request's first response, until the test has let
                # it go, so that it is still running at the Executor when its client leaves.
                if held:
                    resume.wait(60)
                responses = responses_of(**kwargs)
                held.extend(r for r in responses if enqueued[1:2] == [r.request_id])
                return responses

            executor.await_responses = await_responses
            direct = await _collect(engine.submit(_request("direct", 12)))
            leaves = two.submit(_request("leaves", 150))
            await leaves.__anext__()
            stays = asyncio.ensure_future(_collect(one.submit(_request("stays", 12))))
            assert not server._tasks  # the link runs no task per request for this engine
            await leaves.aclose()  # the client left
            while not cancelled:
                await asyncio.sleep(0.01)
            resume.set()
            linked = await asyncio.wait_for(stays, 60)
            assert [t for o in linked for t in o.token_ids] == [t for o in direct for t in o.token_ids]
            assert linked[-1].finish_reason is FinishReason.LENGTH
            await _slots_freed(engine, server)
            assert cancelled == [enqueued[1]] and len(enqueued) == 3

    with fake_tensorrt_llm():
        try:
            asyncio.run(main())
        finally:
            resume.set()


@pytest.mark.parametrize("own_process", [False, True])
def test_a_serving_process_freezes_what_start_up_built_once_loaded(own_process):
    """``serve(own_process=True)`` (the CLI's and every front end's): once loaded, the objects start-up built are in
    the collector's permanent generation (a full collection would otherwise walk them all, stalling every stream);
    served in-process (tests), nothing is frozen."""
    import gc

    from aiohttp import ClientSession

    from lmi_trt.serving.app import serve

    async def main() -> int:
        app, sock = _synthetic_app()
        stop = asyncio.Event()
        server = asyncio.ensure_future(
            serve(app, sock=sock, stop=stop, exit_on_failure_after=None, own_process=own_process)
        )
        async with ClientSession(f"http://127.0.0.1:{sock.getsockname()[1]}") as s:

            async def healthy() -> bool:
                async with s.get("/ping") as r:
                    return r.status == 200

            assert await wait_until(healthy, timeout=60)
            frozen = gc.get_freeze_count()
            async with s.post("/invocations", json={"inputs": "hi", "parameters": {"max_new_tokens": 2}}) as r:
                assert r.status == 200, await r.text()
        stop.set()
        assert await server == 0
        return frozen

    assert gc.get_freeze_count() == 0
    try:
        frozen = asyncio.run(main())
    finally:
        gc.unfreeze()
    assert (frozen > 0) == own_process


def test_a_front_end_that_stops_reading_is_not_sent_the_states_it_cannot_take(tmp_path, monkeypatch):
    """A front end that stops reading (SIGSTOP, a hang: alive, so not replaced) must not make the engine's process
    keep every heartbeat's state and every request's figures for it, without bound (asyncio's transport keeps what
    the socket does not take): a later state says all an earlier one did."""
    from lmi_trt.serving import engine_link

    monkeypatch.setattr(engine_link, "HEARTBEAT_S", 0)  # a heartbeat each turn of the loop

    async def main() -> None:
        engine = synthetic_engine(tiny_tokenizer())
        async with _linked(tmp_path, engine, fronts=0) as (server, _, _):
            server.ready(engine, None)
            async with _raw_front_end(server, "fe-stopped"):  # reads its first state, then nothing
                transport = server._peers["fe-stopped"].connection.transport
                state = len(frame(pickle.dumps(("state", server.state), pickle.HIGHEST_PROTOCOL)))
                for _ in range(4000):  # 4000 states (8 MB) to a socket that takes a few hundred kB
                    await asyncio.sleep(0)
                assert transport.get_write_buffer_size() <= state

    asyncio.run(main())


def test_front_ends_connect_while_the_engine_loads_and_one_front_ends_bad_messages_hurt_no_other(tmp_path):
    """The engine's socket listens from the server's construction: a front end connects and says hello while the
    load holds the engine's event loop, and hears "ready" once it lets go. A front end's messages before its hello, a
    message that is not one, and a frame left half-sent are that front end's loss only."""

    async def main() -> None:
        engine = synthetic_engine(tiny_tokenizer())
        await engine.start()
        server = EngineServer(f"{tmp_path}/engine")
        remote = RemoteEngine(server.address, "fe-good", os.getppid())
        connecting = asyncio.ensure_future(remote.connect())
        reader, writer = await asyncio.open_unix_connection(server.address)
        writer.write(frame(pickle.dumps(("submit", _request("early", 2)))) + frame(b"not a pickle") + b"\xff\xff\xff")
        await writer.drain()
        for _ in range(20):  # the connection and the hello are made, nothing on the engine's side reads them yet
            await asyncio.sleep(0)
        assert not connecting.done()
        await server.start()
        server.ready(engine, None)
        try:
            assert (await asyncio.wait_for(connecting, 10)).phase == "ready"
            outs = await _collect(remote.submit(_request("fine", 5)))
            assert sum(len(o.token_ids) for o in outs) == 5 and outs[-1].finish_reason is FinishReason.LENGTH
            assert server.in_flight == 0 and list(server._peers) == ["fe-good"]
        finally:
            writer.close()
            await remote.close()
            await server.close()
            await engine.close()

    asyncio.run(main())


def test_a_stream_closed_before_its_first_read_is_forgotten(tmp_path):
    """The serving layer may close a stream it never read (a batch whose later prompt failed, a client gone at once):
    it cancels the request, then closes the iterator, and a generator closed before it started runs none of its
    body. The front end must still forget the request once the engine has ended it, not keep it for ever."""

    async def main() -> None:
        engine = synthetic_engine(tiny_tokenizer(), tokens_per_second=50)
        async with _linked(tmp_path, engine) as (server, [remote], [connecting]):
            server.ready(engine, None)
            await asyncio.wait_for(connecting, 10)
            for n in range(3):
                stream = remote.submit(_request(f"unread-{n}", 1000))
                await remote.cancel(f"unread-{n}")  # as GenerationStream.aclose does (serving/core.py)
                await stream.aclose()
            await _slots_freed(engine, server)
            read = await _collect(remote.submit(_request("read", 3)))  # after the others' ends, on one socket
            assert read[-1].finished and remote._streams == {}

    asyncio.run(main())
