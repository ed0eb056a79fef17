"""Names that come from outside (S3 keys, hub ids and revisions, engine-cache manifests) cannot place
or read files outside the folders they belong in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from s3server import s3_server  # noqa: F401  (fixture)

from lmi_trt.compile.cache import MANIFEST_NAME, CacheKeyInputs, EngineCache, Manifest, S3EngineCache, cache_key
from lmi_trt.config import LmiConfig
from lmi_trt.sources import SourceError, resolve_model, resolve_tokenizer
from lmi_trt.sources.s3 import S3Object, cache_dir_for, local_paths, parse_s3_uri

ESCAPES = [
    "../escape.txt",
    "a/../../escape.txt",
    "a/..",
    "..",
    "/etc/passwd",
    "a\\..\\..\\x",
    "a/\0/b",
    "tokenizer/../../../escape",
]


@pytest.mark.parametrize("rel", ["../../escape", "llama/../../escape", "llama/..", "a\\..\\b", "x\0y", ""])
def test_s3_keys_that_would_leave_the_download_folder_are_refused(rel):
    uri = parse_s3_uri("s3://bucket/llama")
    with pytest.raises(SourceError, match="outside the download folder"):
        local_paths(uri, [S3Object("llama/config.json", "e", 2), S3Object(f"llama/{rel}", "e", 1)])


def test_s3_keys_with_empty_components_stay_inside():
    uri = parse_s3_uri("s3://bucket/llama")
    paths = local_paths(uri, [S3Object("llama//a/./b.json", "e", 1)])
    assert [p.as_posix() for p in paths] == ["a/b.json"]


@pytest.mark.parametrize("uri", ["s3://bucket/../../../etc", "s3://../x", "s3://b/..", "s3://b/a/../../../../root"])
def test_s3_cache_folder_is_inside_download_dir_whatever_the_uri(tmp_path, uri):
    folder = cache_dir_for(tmp_path, parse_s3_uri(uri)).resolve()
    assert folder.parent == (tmp_path / "s3").resolve() and len(folder.name) == 16


@pytest.mark.parametrize(
    "name", ["org/../../etc", "org/name/../../../tmp", "..\\..\\windows", "org/na..me/../x", "a" * 300, "org/name\0"]
)
def test_hub_ids_with_traversal_are_errors_not_paths(tmp_path, monkeypatch, name):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)  # nothing relative to the working directory matches these
    before = set(tmp_path.rglob("*"))
    with pytest.raises(SourceError):
        resolve_model(LmiConfig(model_id=name, download_dir=tmp_path / "dl"))
    artifact = None
    with pytest.raises(SourceError):
        resolve_tokenizer(LmiConfig(tokenizer_id=name, download_dir=tmp_path / "dl"), artifact)  # type: ignore[arg-type]
    assert {p for p in tmp_path.rglob("*") if p.is_file()} <= before | {
        p for p in tmp_path.rglob("*") if "hf" in p.parts
    }


@pytest.mark.parametrize("revision", ["../../../../etc/passwd", "main/../../../../etc", "..%2F..%2Fetc"])
def test_revisions_with_traversal_are_errors(tmp_path, monkeypatch, revision):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(SourceError):
        resolve_model(LmiConfig(model_id="org/model", revision=revision, download_dir=tmp_path / "dl"))


# --- the engine cache -----------------------------------------------------------------------------------
def _inputs() -> CacheKeyInputs:
    return CacheKeyInputs(
        fingerprint="fp", plan={"x": 1}, trtllm_version="1.0.0", gpu_sm=90, gpu_name="H100", tp_size=1, pp_size=1
    )


def _manifest(files: dict[str, Any]) -> dict[str, Any]:
    inputs = _inputs()
    return {
        "format": "lmi-trt-engine/1",
        "key": cache_key(inputs),
        "model_id": "m",
        "inputs": inputs.model_dump(mode="json"),
        "files": files,
        "created_at": 0.0,
        "builder": "evil",
    }


@pytest.mark.parametrize("name", ESCAPES + [MANIFEST_NAME, ""])
def test_manifest_file_names_must_stay_inside_the_entry(name):
    with pytest.raises(ValueError, match="plain relative path"):
        Manifest.model_validate(_manifest({name: {"sha256": "0" * 64, "size": 1}}))
    Manifest.model_validate(_manifest({"tokenizer/tokenizer.json": {"sha256": "0" * 64, "size": 1}}))


def test_a_shared_cache_manifest_cannot_write_outside_the_entry(tmp_path, s3_server, caplog):  # noqa: F811
    """Whoever can write to the shared cache prefix must not be able to write files on the host."""
    escape = tmp_path / "escape.txt"
    rel = "../" * 4 + "escape.txt"
    key = cache_key(_inputs())
    bucket = s3_server.new_bucket("enginecache")
    client = s3_server.client()
    client.put_object(
        Bucket=bucket,
        Key=f"cache/{key}/{MANIFEST_NAME}",
        Body=json.dumps(_manifest({rel: {"sha256": "0" * 64, "size": 5}})).encode(),
    )
    client.put_object(Bucket=bucket, Key=f"cache/{key}/{rel}", Body=b"pwned")
    remote = S3EngineCache(f"s3://{bucket}/cache", client=client, settle_s=0)
    cache = EngineCache(tmp_path / "cache" / "root", remote=remote, poll_s=0.01, wait_timeout_s=10)
    built: list[Path] = []

    def build(out: Path) -> None:
        built.append(out)
        (out / "rank0.engine").write_bytes(b"engine")

    result = cache.get_or_build(_inputs(), build, model_id="m")
    assert not escape.exists() and not list(tmp_path.rglob("escape.txt"))
    assert built and (result.path / "rank0.engine").read_bytes() == b"engine"
    assert "unreadable manifest" in caplog.text
