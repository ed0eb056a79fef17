"""The sources stage against real components: a local folder, a hub cache (offline), a real S3 server."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
import pytest
from tinymodels import make_hub_cache, tiny_model

from lmi_trt.config import LmiConfig
from lmi_trt.sources import SourceError, download_s3, hf, parse_s3_uri, resolve_model, resolve_tokenizer
from lmi_trt.sources.s3 import MANIFEST, cache_dir_for, list_objects, sync_objects

if TYPE_CHECKING:
    from s3server import S3Server

pytest_plugins = ["s3server"]  # the s3_server / s3_env fixtures

REPO_ROOT = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def files_of(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def counting_client() -> tuple[object, list[str]]:
    """A client built from the environment (as the code under test builds one) that records GetObject keys."""
    client = boto3.session.Session().client("s3")
    keys: list[str] = []
    client.meta.events.register("before-parameter-build.s3.GetObject", lambda params, **_: keys.append(params["Key"]))
    return client, keys


def leftovers(dest: Path) -> list[Path]:
    return sorted(dest.parent.glob(f".{dest.name}.*"))


# --- local ---------------------------------------------------------------------------------------


def test_local_folder(tmp_path):
    model = tiny_model("llama")
    config = LmiConfig(model_id=str(model), download_dir=tmp_path)
    artifact = resolve_model(config)
    assert (artifact.kind, artifact.source, artifact.path) == ("hf_checkpoint", "local", model.resolve())
    assert artifact.hf_config["model_type"] == "llama"
    assert resolve_tokenizer(config, artifact) == model.resolve()
    assert resolve_model(config).fingerprint == artifact.fingerprint
    assert not any(tmp_path.iterdir())  # nothing copied for a local folder


# --- hub (offline, through a prepared cache in a fresh HF_HOME, in a subprocess) ------------------

HUB_SCRIPT = """
import json, sys
from lmi_trt.config import LmiConfig
from lmi_trt.sources import SourceError, resolve_model, resolve_tokenizer
out = {}
for name, kwargs in json.loads(sys.argv[1]).items():
    config = LmiConfig(**kwargs)
    try:
        a = resolve_model(config)
        out[name] = {"kind": a.kind, "source": a.source, "path": str(a.path), "fingerprint": a.fingerprint,
                     "model_type": (a.hf_config or {}).get("model_type"),
                     "tokenizer": str(resolve_tokenizer(config, a))}
    except SourceError as e:
        out[name] = {"error": str(e)}
print(json.dumps(out))
"""


def run_hub_cases(hf_home: Path, cases: dict[str, dict], env: dict[str, str] | None = None) -> dict[str, dict]:
    """Resolve each case in a fresh interpreter, so HF_HOME and HF_HUB_OFFLINE apply (read at import)."""
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", **(env or {})}
    env.pop("HF_HUB_CACHE", None)
    env.pop("HF_TOKEN", None)
    proc = subprocess.run(
        [sys.executable, "-c", HUB_SCRIPT, json.dumps(cases)],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_hub_id_through_cache_and_not_cached_errors(tmp_path):
    hf_home = tmp_path / "hf"
    snapshot = make_hub_cache(tiny_model("llama"), hf_home, "acme/tiny-llama", COMMIT)
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "config.json").write_text(json.dumps({"version": "1", "build_config": {}, "pretrained_config": {}}))
    (engine / "rank0.engine").write_bytes(b"e")
    dl = str(tmp_path / "dl")
    out = run_hub_cases(
        hf_home,
        {
            "cached": {"model_id": "acme/tiny-llama", "download_dir": dl},
            "pinned": {"model_id": "acme/tiny-llama", "revision": COMMIT, "download_dir": dl},
            "missing": {"model_id": "acme/not-cached", "download_dir": dl},
            "bad_revision": {"model_id": "acme/tiny-llama", "revision": "v9", "download_dir": dl},
            "engine_with_hub_tokenizer": {
                "model_id": str(engine),
                "tokenizer_id": "acme/tiny-llama",
                "download_dir": dl,
            },
        },
    )
    for case in ("cached", "pinned"):
        assert out[case] == {
            "kind": "hf_checkpoint",
            "source": "hf",
            "path": str(snapshot),
            "fingerprint": f"hf-{COMMIT}",
            "model_type": "llama",
            "tokenizer": str(snapshot),
        }
    missing = out["missing"]["error"]
    assert "'acme/not-cached'" in missing and "HF_HUB_OFFLINE" in missing and "HF_HOME" in missing
    assert "revision 'v9'" in out["bad_revision"]["error"]
    assert out["engine_with_hub_tokenizer"]["tokenizer"] == str(snapshot)
    assert out["engine_with_hub_tokenizer"]["kind"] == "trtllm_engine"


def write_tree_listing(hf_home: Path, repo_id: str, names: list[str]) -> None:
    """What an earlier online snapshot_download leaves: the repo's full listing at that commit (trees/<sha>.json)."""
    trees = hf_home / "hub" / ("models--" + repo_id.replace("/", "--")) / "trees"
    trees.mkdir(parents=True, exist_ok=True)
    files = {n: {"size": 1, "blob_id": "0" * 40} for n in names}
    (trees / f"{COMMIT}.json").write_text(json.dumps({"format_version": 1, "files": files}))


@pytest.mark.skipif(
    hf.get_cached_repo_tree is None,
    reason="this huggingface_hub keeps no cached repo listing (none < 1.0 does: the images' ones)",
)
def test_hub_offline_with_cached_listing_takes_only_the_selected_files(tmp_path):
    """The cache holds the files our selection chose earlier; the listing also names *.bin, original/*.pth and
    remote code that were (rightly) never fetched. Offline start must still accept the snapshot, and must
    refuse one that lacks a selected file."""
    hf_home = tmp_path / "hf"
    model = tiny_model("llama")
    repo_files = [p.name for p in model.iterdir()] + [
        "pytorch_model.bin",
        "original/consolidated.00.pth",
        "modeling_llama.py",
        "README.md",
    ]
    for repo_id in ("acme/listed", "acme/partial"):
        make_hub_cache(model, hf_home, repo_id, COMMIT)
    write_tree_listing(hf_home, "acme/listed", repo_files)
    write_tree_listing(hf_home, "acme/partial", repo_files + ["model-00002-of-00002.safetensors"])
    out = run_hub_cases(
        hf_home,
        {
            "listed": {"model_id": "acme/listed", "download_dir": str(tmp_path)},
            "partial": {"model_id": "acme/partial", "download_dir": str(tmp_path)},
        },
    )
    assert out["listed"]["kind"] == "hf_checkpoint"
    assert "'acme/partial'" in out["partial"]["error"] and "only part of the files" in out["partial"]["error"]


class _HubErrors(http.server.BaseHTTPRequestHandler):
    """Answers every hub call the way huggingface.co does for gated / missing repos and unknown revisions."""

    seen_auth: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.seen_auth.append(self.headers.get("Authorization", ""))
        if "gated" in self.path:
            status, code = 403, "GatedRepo"
        elif "/revision/" in self.path or "/tree/v9" in self.path:
            status, code = 404, "RevisionNotFound"
        else:
            status, code = 401, "RepoNotFound"
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_HEAD = do_GET

    def log_message(self, *args: object) -> None:
        pass


def test_hub_errors_from_a_server_answering_like_the_hub(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HubErrors)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}"}
        dl = str(tmp_path / "dl")
        out = run_hub_cases(
            tmp_path / "hf",
            {
                "gated": {"model_id": "meta/gated-model", "hf_token": "hf_test_token", "download_dir": dl},
                "missing": {"model_id": "acme/private-or-missing", "download_dir": dl},
                "revision": {"model_id": "acme/model", "revision": "v9", "download_dir": dl},
            },
            env,
        )
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert "option.model_id 'meta/gated-model' is a gated repo" in out["gated"]["error"]
    assert "HF_TOKEN" in out["gated"]["error"]
    assert "'acme/private-or-missing' was not found" in out["missing"]["error"]
    assert "HF_TOKEN" in out["missing"]["error"]
    assert "has no revision 'v9'" in out["revision"]["error"]
    assert "Bearer hf_test_token" in _HubErrors.seen_auth  # config.hf_token reached the hub


# --- S3 ------------------------------------------------------------------------------------------


def test_s3_download_reuse_and_change(s3_env: S3Server, tmp_path):
    model = tiny_model("llama")
    bucket = s3_env.new_bucket()
    uri = f"s3://{bucket}/models/tiny-llama"
    s3_env.upload_folder(model, uri)
    # A sibling prefix that starts with the same letters must not be mixed in.
    s3_env.client().put_object(Bucket=bucket, Key="models/tiny-llama-v2/stray.txt", Body=b"x")

    config = LmiConfig(model_id=uri, download_dir=tmp_path)
    first = resolve_model(config)
    dest = cache_dir_for(tmp_path, parse_s3_uri(uri))
    assert (first.kind, first.source, first.path) == ("hf_checkpoint", "s3", dest)
    assert files_of(dest) == files_of(model)
    assert first.fingerprint.startswith("s3-") and first.tokenizer_dir == dest
    assert resolve_tokenizer(config, first) == dest

    # Second resolve: the listing matches the manifest, nothing is fetched.
    client, fetched = counting_client()
    assert download_s3(uri, tmp_path, client=client) == (dest, first.fingerprint)
    assert fetched == []

    # One object changes: only it is fetched again, and the fingerprint moves.
    s3_env.client().put_object(Bucket=bucket, Key="models/tiny-llama/generation_config.json", Body=b'{"changed": 1}')
    client, fetched = counting_client()
    path, fingerprint = download_s3(uri, tmp_path, client=client)
    assert fetched == ["models/tiny-llama/generation_config.json"]
    assert fingerprint != first.fingerprint
    assert (path / "generation_config.json").read_bytes() == b'{"changed": 1}'
    assert files_of(path).keys() == files_of(model).keys()
    assert leftovers(dest) == []

    # A local file damaged behind our back is not trusted either.
    (dest / "config.json").write_text("{}")
    client, fetched = counting_client()
    download_s3(uri, tmp_path, client=client)
    assert fetched == ["models/tiny-llama/config.json"]
    assert (dest / "config.json").read_bytes() == (model / "config.json").read_bytes()


def test_s3_object_failing_mid_download_leaves_nothing_complete(s3_env: S3Server, tmp_path):
    model = tiny_model("llama")
    bucket = s3_env.new_bucket()
    uri = f"s3://{bucket}/llama"
    s3_env.upload_folder(model, uri)
    client = boto3.session.Session().client("s3")
    parsed = parse_s3_uri(uri)
    dest = cache_dir_for(tmp_path, parsed)
    listing = list_objects(client, parsed)
    # The object disappears between listing and download.
    s3_env.client().delete_object(Bucket=bucket, Key="llama/tokenizer.json")
    with pytest.raises(SourceError, match=rf"s3://{bucket}/llama/tokenizer.json changed or disappeared"):
        sync_objects(client, parsed, listing, dest)
    assert not dest.exists() and leftovers(dest) == []

    s3_env.client().upload_file(str(model / "tokenizer.json"), bucket, "llama/tokenizer.json")
    assert resolve_model(LmiConfig(model_id=uri, download_dir=tmp_path)).path == dest
    assert files_of(dest) == files_of(model)


KILL_SCRIPT = """
import sys
from pathlib import Path
from lmi_trt.config import LmiConfig
from lmi_trt.sources import resolve_model
resolve_model(LmiConfig(model_id=sys.argv[1], download_dir=Path(sys.argv[2])), s3_max_concurrency=1)
"""


def test_s3_killed_download_is_not_taken_as_complete(s3_env: S3Server, tmp_path):
    model = tiny_model("llama")
    bucket = s3_env.new_bucket()
    uri = f"s3://{bucket}/llama"
    s3_env.upload_folder(model, uri)
    s3_env.client().put_object(Bucket=bucket, Key="llama/zz-extra.safetensors", Body=os.urandom(1 << 20) * 48)
    dest = cache_dir_for(tmp_path, parse_s3_uri(uri))

    proc = subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT, uri, str(tmp_path)],
        cwd=REPO_ROOT,
        env={**os.environ, **s3_env.env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not any(p.is_file() for d in leftovers(dest) for p in d.rglob("*")):
            assert proc.poll() is None, f"download ended before it could be interrupted: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "the download never started"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
        proc.stderr.close()
    assert not dest.exists(), "an interrupted download must not be in the final place"
    assert leftovers(dest), "the partial folder is what was left"

    artifact = resolve_model(LmiConfig(model_id=uri, download_dir=tmp_path))
    assert artifact.path == dest
    assert files_of(dest).keys() == files_of(model).keys() | {"zz-extra.safetensors"}
    assert leftovers(dest) == []


def test_s3_triton_repo_at_root_and_one_level_deeper(s3_env: S3Server, tmp_path):
    """ds#2498: model_id may name the Triton repo or its tensorrt_llm/ folder; a tokenizer_id may be s3:// too."""
    bucket = s3_env.new_bucket()
    repo = tmp_path / "repo"
    (repo / "tensorrt_llm" / "1").mkdir(parents=True)
    (repo / "tensorrt_llm" / "config.pbtxt").write_text('name: "tensorrt_llm"')
    (repo / "tensorrt_llm" / "1" / "config.json").write_text(json.dumps({"version": "1", "build_config": {}}))
    (repo / "tensorrt_llm" / "1" / "rank0.engine").write_bytes(b"engine")
    s3_env.upload_folder(repo, f"s3://{bucket}/repo")
    s3_env.upload_folder(tiny_model("llama"), f"s3://{bucket}/tokenizers/llama")

    for uri, engine_dir in ((f"s3://{bucket}/repo", "tensorrt_llm/1"), (f"s3://{bucket}/repo/tensorrt_llm", "1")):
        config = LmiConfig(model_id=uri, download_dir=tmp_path / "dl")
        artifact = resolve_model(config)
        root = cache_dir_for(tmp_path / "dl", parse_s3_uri(uri))
        assert (artifact.kind, artifact.engine_layout, artifact.engine_dir) == (
            "trtllm_engine",
            "triton",
            root / engine_dir,
        )
        assert artifact.tokenizer_dir is None
        with pytest.raises(SourceError, match="this engine folder has no tokenizer files"):
            resolve_tokenizer(config, artifact)
        with_tokenizer = config.model_copy(update={"tokenizer_id": f"s3://{bucket}/tokenizers/llama"})
        tok = resolve_tokenizer(with_tokenizer, artifact)
        assert (tok / "tokenizer.json").is_file()


def test_s3_endpoint_from_service_specific_variable(s3_env: S3Server, tmp_path, monkeypatch):
    """boto3 reads AWS_ENDPOINT_URL_S3 itself (as it does AWS_ENDPOINT_URL, used by every other test)."""
    bucket = s3_env.new_bucket()
    s3_env.upload_folder(tiny_model("llama"), f"s3://{bucket}/m")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_env.endpoint)
    assert resolve_model(LmiConfig(model_id=f"s3://{bucket}/m", download_dir=tmp_path)).kind == "hf_checkpoint"


def test_s3_errors_name_the_uri(s3_env: S3Server, tmp_path, monkeypatch):
    bucket = s3_env.new_bucket()
    s3_env.client().put_object(Bucket=bucket, Key="other/config.json", Body=b"{}")

    def error(uri: str) -> str:
        with pytest.raises(SourceError) as e:
            resolve_model(LmiConfig(model_id=uri, download_dir=tmp_path))
        return str(e.value)

    msg = error("s3://no-such-bucket-here/llama")
    assert "'no-such-bucket-here' does not exist" in msg and "s3://no-such-bucket-here/llama/" in msg
    msg = error(f"s3://{bucket}/llama")
    assert f"no objects under s3://{bucket}/llama/" in msg and "prefix" in msg
    s3_env.client().put_object(Bucket=bucket, Key="bad/x/../../../escape.json", Body=b"{}")
    msg = error(f"s3://{bucket}/bad")
    assert "'x/../../../escape.json'" in msg and "outside the download folder" in msg
    assert not (tmp_path.parent / "escape.json").exists()

    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    msg = error(f"s3://{bucket}/other")
    assert "no AWS credentials" in msg and f"s3://{bucket}/other/" in msg and "AWS_ACCESS_KEY_ID" in msg
