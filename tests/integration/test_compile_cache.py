"""The engine cache: keys, manifests, atomic publish, one build per key (host lock, S3 lease)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from s3server import s3_server  # noqa: F401  (fixture)

from lmi_trt.compile.cache import (
    MANIFEST_NAME,
    CacheKeyInputs,
    EngineCache,
    S3EngineCache,
    cache_key,
    explain_change,
    make_manifest,
    read_manifest,
    verify_entry,
)
from lmi_trt.compile.errors import CacheError
from lmi_trt.compile.options import CompileOptions
from lmi_trt.compile.plan import GpuFacts, make_plan

REPO = Path(__file__).resolve().parents[2]
H100 = GpuFacts(name="NVIDIA H100 80GB HBM3", sm=90, memory_gib=80, count=2)
HF = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 512,
    "dtype": "float32",
}


def inputs(fingerprint: str = "fp-1", gpu: GpuFacts = H100, version: str = "1.0.0", **opts) -> CacheKeyInputs:
    options = CompileOptions(**{"max_input_len": 128, "max_output_len": 64, **opts})
    return CacheKeyInputs.from_plan(fingerprint, make_plan(options, HF, gpu, version), gpu)


class Builder:
    """A build function that writes a fake engine and counts its calls."""

    def __init__(self, payload: bytes = b"engine-bytes", fail_after_first_file: bool = False) -> None:
        self.calls = 0
        self.payload, self.fail = payload, fail_after_first_file

    def __call__(self, out: Path) -> None:
        self.calls += 1
        (out / "rank0.engine").write_bytes(self.payload * 100)
        if self.fail:
            raise RuntimeError("build blew up half way")
        (out / "config.json").write_text(json.dumps({"version": "1.0.0", "build_config": {}}))
        (out / "tokenizer").mkdir()
        (out / "tokenizer" / "tokenizer.json").write_text("{}")


# ---------------------------------------------------------------------------------------------- keys


def test_same_inputs_same_key_and_notes_do_not_matter():
    a, b = inputs(), inputs()
    assert cache_key(a) == cache_key(b) and len(cache_key(a)) == 64
    plan = make_plan(CompileOptions(max_input_len=128, max_output_len=64), HF, H100, "1.0.0")
    noted = plan.model_copy(update={"notes": ("something else",)})
    assert cache_key(CacheKeyInputs.from_plan("fp-1", noted, H100)) == cache_key(a)


@pytest.mark.parametrize(
    "change",
    [
        dict(max_input_len=256),
        dict(max_output_len=32),
        dict(dtype="bf16"),
        dict(quantize="weights_int8"),
        dict(max_batch_size=8),
        dict(tokens_per_block=64),
        dict(enable_kv_cache_reuse=True, tensor_parallel_degree=2),
        dict(tensor_parallel_degree=2),
        dict(fingerprint="fp-2"),
        dict(version="1.1.0"),
        dict(gpu=H100.model_copy(update={"sm": 89, "name": "NVIDIA L40S"})),
        dict(gpu=H100.model_copy(update={"name": "NVIDIA H100 PCIe"})),
    ],
)
def test_each_input_changes_the_key(change):
    assert cache_key(inputs(**change)) != cache_key(inputs())


def test_explain_change_names_the_inputs():
    changes = explain_change(inputs(), inputs(max_input_len=256, version="1.1.0"))
    assert "plan.max_input_len: 128 → 256" in changes
    assert "trtllm_version: '1.0.0' → '1.1.0'" in changes and "plan.trtllm_version: '1.0.0' → '1.1.0'" in changes
    assert all(c.startswith(("plan.", "trtllm_version")) for c in changes)


# -------------------------------------------------------------------------------------- local cache


def test_build_once_then_hit(tmp_path):
    cache, build = EngineCache(tmp_path), Builder()
    first = cache.get_or_build(inputs(), build, model_id="acme/tiny")
    second = cache.get_or_build(inputs(), build, model_id="acme/tiny")
    assert (first.source, second.source, build.calls) == ("built", "local", 1)
    assert first.path == second.path == tmp_path / "entries" / first.key
    manifest = read_manifest(first.path)
    assert manifest is not None and manifest.key == first.key and manifest.model_id == "acme/tiny"
    assert set(manifest.files) == {"rank0.engine", "config.json", "tokenizer/tokenizer.json"}
    assert manifest.files["rank0.engine"].size == len(b"engine-bytes") * 100
    assert list((tmp_path / "tmp").iterdir()) == []


def test_miss_logs_which_input_changed(tmp_path, caplog):
    cache = EngineCache(tmp_path)
    cache.get_or_build(inputs(), Builder(), model_id="acme/tiny")
    with caplog.at_level(logging.INFO, logger="lmi_trt.compile.cache"):
        result = cache.get_or_build(inputs(max_input_len=256), Builder(), model_id="acme/tiny")
    assert result.source == "built"
    assert "plan.max_input_len: 128 → 256" in caplog.text and "plan.max_seq_len: 192 → 320" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lmi_trt.compile.cache"):
        cache.get_or_build(inputs(fingerprint="fp-other"), Builder(), model_id="other/model")
    assert "no entry of this model yet" in caplog.text


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "extra", "manifest"])
def test_damaged_entry_is_rejected_and_rebuilt(tmp_path, damage, caplog):
    cache, build = EngineCache(tmp_path), Builder()
    entry = cache.get_or_build(inputs(), build, model_id="m").path
    engine = entry / "rank0.engine"
    if damage == "flip":
        data = bytearray(engine.read_bytes())
        data[10] ^= 0xFF
        engine.write_bytes(bytes(data))
    elif damage == "truncate":
        engine.write_bytes(engine.read_bytes()[:-1])
    elif damage == "delete":
        engine.unlink()
    elif damage == "extra":
        (entry / "rank1.engine").write_bytes(b"stray")
    else:
        (entry / MANIFEST_NAME).write_text("{not json")
    assert verify_entry(entry, cache_key(inputs())) is not None
    with caplog.at_level(logging.WARNING):
        assert cache.lookup(cache_key(inputs())) is None
    assert "damaged" in caplog.text
    again = cache.get_or_build(inputs(), build, model_id="m")
    assert again.source == "built" and build.calls == 2 and verify_entry(again.path, again.key) is None


def test_size_mode_skips_hashing_but_checks_sizes(tmp_path):
    cache = EngineCache(tmp_path, verify="size")
    entry = cache.get_or_build(inputs(), Builder(), model_id="m").path
    engine = entry / "rank0.engine"
    data = bytearray(engine.read_bytes())
    data[0] ^= 0xFF
    engine.write_bytes(bytes(data))
    assert cache.lookup(cache_key(inputs())) == entry  # same size: accepted in size mode
    assert verify_entry(entry, cache_key(inputs()), "sha256") is not None
    engine.write_bytes(b"short")
    assert cache.lookup(cache_key(inputs())) is None


def test_manifest_for_another_key_is_rejected(tmp_path):
    cache = EngineCache(tmp_path)
    a = cache.get_or_build(inputs(), Builder(), model_id="m")
    b_key = cache_key(inputs(max_input_len=256))
    os.rename(a.path, cache.entry_dir(b_key))
    assert "manifest is for key" in verify_entry(cache.entry_dir(b_key), b_key)
    assert cache.lookup(b_key) is None


def test_build_exception_leaves_nothing(tmp_path):
    cache = EngineCache(tmp_path)
    with pytest.raises(RuntimeError, match="half way"):
        cache.get_or_build(inputs(), Builder(fail_after_first_file=True), model_id="m")
    assert list((tmp_path / "entries").iterdir()) == [] and list((tmp_path / "tmp").iterdir()) == []
    assert cache.lookup(cache_key(inputs())) is None


_WORKER = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from lmi_trt.compile.cache import CacheKeyInputs, EngineCache
    root, log, sleep, inputs_file = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4])
    inputs = CacheKeyInputs.model_validate_json(inputs_file.read_text())
    def build(out):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\\n")
        (out / "rank0.engine").write_bytes(b"x" * 4096)
        (log.parent / "started.tmp").write_text(str(out))  # renamed whole: the test never reads it half-written
        (log.parent / "started.tmp").rename(log.parent / "started")
        time.sleep(sleep)
        (out / "config.json").write_text("{}")
    result = EngineCache(root).get_or_build(inputs, build, model_id="m")
    print(json.dumps({"source": result.source, "path": str(result.path)}))
""")


def _spawn(tmp_path: Path, root: Path, sleep: float) -> subprocess.Popen:
    script, inputs_file = tmp_path / "worker.py", tmp_path / "inputs.json"
    script.write_text(_WORKER)
    inputs_file.write_text(inputs().model_dump_json())
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, str(script), str(root), str(tmp_path / "builds.log"), str(sleep), str(inputs_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )


def test_two_processes_exactly_one_builds(tmp_path):
    root = tmp_path / "cache"
    procs = [_spawn(tmp_path, root, sleep=1.0) for _ in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["source"] for r in results) == ["built", "local"]
    assert results[0]["path"] == results[1]["path"]
    assert len((tmp_path / "builds.log").read_text().split()) == 1


def test_killed_build_leaves_nothing_that_looks_complete(tmp_path):
    root = tmp_path / "cache"
    proc = _spawn(tmp_path, root, sleep=60)
    deadline = time.monotonic() + 30
    while not (tmp_path / "started").exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    proc.stdout.close()
    proc.stderr.close()
    key = cache_key(inputs())
    half_built = Path((tmp_path / "started").read_text())
    assert half_built.exists() and not (root / "entries" / key).exists()
    cache = EngineCache(root, lock_timeout_s=10)  # the dead process's lock is free again
    assert cache.lookup(key) is None
    result = cache.get_or_build(inputs(), Builder(), model_id="m")
    assert result.source == "built" and not half_built.exists()


def test_lock_timeout_names_the_lock(tmp_path):
    from filelock import FileLock

    cache = EngineCache(tmp_path, lock_timeout_s=0.2)
    lock = FileLock(str(tmp_path / "locks" / f"{cache_key(inputs())}.lock"))
    held = threading.Event()
    release = threading.Event()

    def hold():
        with lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(5)
    try:
        with pytest.raises(CacheError, match="another process on this host"):
            cache.get_or_build(inputs(), Builder(), model_id="m")
    finally:
        release.set()
        t.join()


# ---------------------------------------------------------------------------------------------- S3


@pytest.fixture
def remote(s3_server):  # noqa: F811
    bucket = s3_server.new_bucket("engines")
    return S3EngineCache(f"s3://{bucket}/cache", s3_server.client(), settle_s=0.05)


def _cache(root: Path, remote: S3EngineCache, **kw) -> EngineCache:
    return EngineCache(root, remote, poll_s=0.05, lease_ttl_s=30, **kw)


def test_build_uploads_and_another_host_downloads(tmp_path, remote):
    build = Builder()
    first = _cache(tmp_path / "host-a", remote).get_or_build(inputs(), build, model_id="m")
    assert first.source == "built"
    keys = {o["Key"] for o in remote.client.list_objects_v2(Bucket=remote.bucket)["Contents"]}
    assert keys == {
        f"cache/{first.key}/{name}"
        for name in ("rank0.engine", "config.json", "tokenizer/tokenizer.json", MANIFEST_NAME)
    }
    second = _cache(tmp_path / "host-b", remote).get_or_build(inputs(), build, model_id="m")
    assert second.source == "remote" and build.calls == 1
    assert (second.path / "rank0.engine").read_bytes() == (first.path / "rank0.engine").read_bytes()
    assert verify_entry(second.path, second.key) is None
    assert remote.read_lease(first.key) is None  # released after the upload


def test_waits_for_the_lease_holder_then_downloads(tmp_path, remote, caplog):
    key = cache_key(inputs())
    assert remote.try_acquire(key, "other-host:1:abc", ttl_s=60)
    build = Builder()
    result: dict = {}

    def replica():
        result["r"] = _cache(tmp_path / "waiting", remote).get_or_build(inputs(), build, model_id="m")

    with caplog.at_level(logging.INFO, logger="lmi_trt.compile.cache"):
        t = threading.Thread(target=replica)
        t.start()
        time.sleep(0.5)
        assert t.is_alive() and build.calls == 0
        # the other replica finishes: entry uploaded (manifest last), lease released
        built = tmp_path / "other"
        built.mkdir()
        Builder()(built)
        remote.upload(key, built, make_manifest(built, inputs(), "m"))
        remote.release(key, "other-host:1:abc")
        t.join(timeout=30)
    assert result["r"].source == "remote" and build.calls == 0
    assert "other-host:1:abc is building" in caplog.text


def test_expired_lease_is_taken_over(tmp_path, remote):
    key = cache_key(inputs())
    assert remote.try_acquire(key, "dead-host:1:abc", ttl_s=0.01)
    time.sleep(0.05)
    build = Builder()
    result = _cache(tmp_path / "a", remote).get_or_build(inputs(), build, model_id="m")
    assert result.source == "built" and build.calls == 1
    assert remote.read_lease(key) is None and remote.manifest(key) is not None


def test_wait_for_a_live_lease_times_out_with_its_name(tmp_path, remote):
    key = cache_key(inputs())
    assert remote.try_acquire(key, "busy-host:1:abc", ttl_s=60)
    with pytest.raises(CacheError, match=r"\.lease"):
        _cache(tmp_path / "a", remote, wait_timeout_s=0.3).get_or_build(inputs(), Builder(), model_id="m")


def test_two_hosts_at_once_build_once(tmp_path, remote):
    builds = Builder()
    lock = threading.Lock()

    def slow_build(out: Path) -> None:
        with lock:
            builds(out)
        time.sleep(0.5)

    results = []
    threads = [
        threading.Thread(
            target=lambda i=i: results.append(
                _cache(tmp_path / f"host-{i}", remote).get_or_build(inputs(), slow_build, model_id="m")
            )
        )
        for i in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(r.source for r in results) == ["built", "remote"] and builds.calls == 1


def test_damaged_remote_entry_is_rebuilt_and_replaced(tmp_path, remote, caplog):
    key = cache_key(inputs())
    built = tmp_path / "other"
    built.mkdir()
    Builder()(built)
    remote.upload(key, built, make_manifest(built, inputs(), "m"))
    remote.client.put_object(Bucket=remote.bucket, Key=f"cache/{key}/rank0.engine", Body=b"torn")
    build = Builder()
    with caplog.at_level(logging.WARNING):
        result = _cache(tmp_path / "a", remote).get_or_build(inputs(), build, model_id="m")
    assert result.source == "built" and build.calls == 1 and "damaged" in caplog.text
    fresh = _cache(tmp_path / "b", remote).get_or_build(inputs(), Builder(), model_id="m")
    assert fresh.source == "remote"


class _NoConditionalWrites:
    """An S3 client of a server without If-None-Match/If-Match on PUT (create-then-verify path)."""

    def __init__(self, client) -> None:
        self._client = client
        self.refused = 0

    def put_object(self, **kwargs):
        if "IfNoneMatch" in kwargs or "IfMatch" in kwargs:
            from botocore.exceptions import ClientError

            self.refused += 1
            raise ClientError(
                {
                    "Error": {"Code": "NotImplemented", "Message": "conditional writes"},
                    "ResponseMetadata": {"HTTPStatusCode": 501},
                },
                "PutObject",
            )
        return self._client.put_object(**kwargs)

    def __getattr__(self, name):
        return getattr(self._client, name)


def test_lease_without_conditional_writes(tmp_path, remote):
    plain = _NoConditionalWrites(remote.client)
    fallback = S3EngineCache(remote.uri, plain, settle_s=0.05)
    key = cache_key(inputs())
    assert fallback.try_acquire(key, "me:1:a", ttl_s=60)
    assert not fallback.try_acquire(key, "you:2:b", ttl_s=60)  # live lease seen before writing
    assert fallback.renew(key, "me:1:a", ttl_s=60) and plain.refused >= 2
    fallback.release(key, "me:1:a")
    result = _cache(tmp_path / "a", fallback).get_or_build(inputs(), Builder(), model_id="m")
    assert result.source == "built" and fallback.read_lease(key) is None


def test_bad_uri_is_an_error():
    with pytest.raises(CacheError, match="s3://bucket/prefix"):
        S3EngineCache("gs://x/y", client=object())


def test_upload_cut_short_is_not_an_entry(tmp_path, remote):
    key = cache_key(inputs())
    built = tmp_path / "other"
    built.mkdir()
    Builder()(built)
    manifest = make_manifest(built, inputs(), "m")
    for rel in manifest.files:  # every file but the manifest: the uploader died before the end
        remote.client.upload_file(str(built / rel), remote.bucket, f"cache/{key}/{rel}")
    assert remote.manifest(key) is None
    build = Builder()
    assert _cache(tmp_path / "a", remote).get_or_build(inputs(), build, model_id="m").source == "built"
    assert build.calls == 1


def test_miss_on_a_new_host_explains_against_remote_entries(tmp_path, remote, caplog):
    _cache(tmp_path / "host-a", remote).get_or_build(inputs(), Builder(), model_id="acme/tiny")
    with caplog.at_level(logging.INFO, logger="lmi_trt.compile.cache"):
        result = _cache(tmp_path / "host-b", remote).get_or_build(inputs(dtype="bf16"), Builder(), model_id="acme/tiny")
    assert result.source == "built"
    assert "plan.dtype: 'float16' → 'bfloat16'" in caplog.text
