"""detect_artifact over every layout, plus the pure pieces of the sources stage (paths, URIs, file choice)."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

import pytest

from lmi_trt.config import LmiConfig
from lmi_trt.sources import (
    ModelArtifact,
    SourceError,
    detect_artifact,
    local_fingerprint,
    parse_s3_uri,
    resolve_model,
    resolve_tokenizer,
    safe_relpath,
    select_hub_files,
)
from lmi_trt.sources.s3 import MANIFEST, S3Object, cache_dir_for, listing_fingerprint, local_paths

HF_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64}
ENGINE_CONFIG = {
    "version": "1.0.0",
    "pretrained_config": {"architecture": "LlamaForCausalLM", "dtype": "float16", "mapping": {"tp_size": 2}},
    "build_config": {"max_batch_size": 8, "max_input_len": 256},
}
LEGACY_CONFIG = {"builder_config": {"name": "llama", "precision": "float16", "tensor_parallel": 1}, "plugin_config": {}}
CKPT_CONFIG = {
    "architecture": "LlamaForCausalLM",
    "dtype": "float16",
    "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
    "quantization": {"quant_algo": "FP8"},
}
TOKENIZER = {"tokenizer.json": "{}", "tokenizer_config.json": "{}"}


def make(root: Path, files: dict[str, object]) -> Path:
    """Write ``{relative path: dict (JSON) | str}`` under ``root``."""
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content) if isinstance(content, dict) else str(content))
    return root


def triton_repo(root: Path, engine_files: dict[str, object] | None = None) -> Path:
    """The DJL/Triton layout: <root>/tensorrt_llm/{config.pbtxt, HF config, tokenizer, 1/{engines}}."""
    engine_files = engine_files or {"config.json": ENGINE_CONFIG, "rank0.engine": "x", "rank1.engine": "x"}
    return make(
        root,
        {
            "tensorrt_llm/config.pbtxt": 'name: "tensorrt_llm"',
            "tensorrt_llm/config.json": HF_CONFIG,
            **{f"tensorrt_llm/{k}": v for k, v in TOKENIZER.items()},
            **{f"tensorrt_llm/1/{k}": v for k, v in engine_files.items()},
            "preprocessing/config.pbtxt": 'name: "preprocessing"',
            "postprocessing/config.pbtxt": 'name: "postprocessing"',
            "ensemble/config.pbtxt": 'name: "ensemble"',
            "ensemble/1/.gitkeep": "",
        },
    )


# --- layouts -------------------------------------------------------------------------------------


def test_hf_checkpoint(tmp_path):
    make(tmp_path, {"config.json": HF_CONFIG, "model.safetensors": "w", **TOKENIZER, "generation_config.json": {}})
    a = detect_artifact(tmp_path, model_id="m")
    assert a == ModelArtifact(
        path=tmp_path.resolve(),
        kind="hf_checkpoint",
        source="local",
        model_id="m",
        fingerprint=a.fingerprint,
        tokenizer_dir=tmp_path.resolve(),
    )
    assert a.hf_config == HF_CONFIG
    assert a.fingerprint.startswith("local-")
    assert (a.engine_dir, a.engine_layout) == (None, None)


def test_hf_checkpoint_with_bin_weights_and_no_tokenizer(tmp_path):
    make(tmp_path, {"config.json": HF_CONFIG, "pytorch_model-00001-of-00002.bin": "w"})
    a = detect_artifact(tmp_path, model_id="m")
    assert a.kind == "hf_checkpoint"
    assert a.tokenizer_dir is None


def test_llmapi_engine(tmp_path):
    make(tmp_path, {"config.json": ENGINE_CONFIG, "rank0.engine": "e", "rank1.engine": "e", **TOKENIZER})
    a = detect_artifact(tmp_path, model_id="m")
    assert (a.kind, a.engine_layout, a.engine_dir, a.path) == ("trtllm_engine", "llmapi", tmp_path, tmp_path)
    assert a.tokenizer_dir == tmp_path
    assert a.hf_config is None  # the engine's config.json is not an HF config


def test_legacy_engine_names(tmp_path):
    make(
        tmp_path,
        {"config.json": LEGACY_CONFIG, "llama_float16_tp2_rank0.engine": "e", "llama_float16_tp2_rank1.engine": "e"},
    )
    a = detect_artifact(tmp_path, model_id="m")
    assert (a.kind, a.engine_layout, a.engine_dir) == ("trtllm_engine", "legacy", tmp_path)
    assert a.tokenizer_dir is None


def test_legacy_engine_names_with_pp(tmp_path):
    make(tmp_path, {"config.json": LEGACY_CONFIG, "gpt_float16_tp1_pp2_rank1.engine": "e"})
    assert detect_artifact(tmp_path, model_id="m").engine_layout == "legacy"


def test_triton_repo_at_root(tmp_path):
    """model_id names the parent of tensorrt_llm/ (what the DJL tutorial says)."""
    triton_repo(tmp_path)
    a = detect_artifact(tmp_path, model_id="m")
    trt = tmp_path / "tensorrt_llm"
    assert (a.kind, a.engine_layout, a.path, a.engine_dir) == ("trtllm_engine", "triton", trt, trt / "1")
    assert a.tokenizer_dir == trt
    assert a.hf_config == HF_CONFIG


def test_triton_model_folder_itself(tmp_path):
    """model_id names tensorrt_llm/ itself: DJL tried to JIT-compile it and failed (ds#2498); we serve it."""
    triton_repo(tmp_path)
    a = detect_artifact(tmp_path / "tensorrt_llm", model_id="m")
    assert (a.kind, a.engine_layout, a.engine_dir) == ("trtllm_engine", "triton", tmp_path / "tensorrt_llm" / "1")
    assert a.tokenizer_dir == tmp_path / "tensorrt_llm"


def test_triton_repo_with_legacy_engines_and_several_versions(tmp_path):
    triton_repo(tmp_path, {"config.json": LEGACY_CONFIG, "llama_float16_tp1_rank0.engine": "e"})
    make(
        tmp_path,
        {
            "tensorrt_llm/3/config.json": ENGINE_CONFIG,
            "tensorrt_llm/3/rank0.engine": "e",
            "tensorrt_llm/20/README": "not an engine",
        },
    )
    a = detect_artifact(tmp_path, model_id="m")
    assert a.engine_dir == tmp_path / "tensorrt_llm" / "3"  # the highest version that holds engines


def test_tokenizer_beside_engines_in_version_folder(tmp_path):
    triton_repo(tmp_path)
    for name in TOKENIZER:
        (tmp_path / "tensorrt_llm" / name).unlink()
    make(tmp_path, {"tensorrt_llm/1/tokenizer.json": "{}"})
    assert detect_artifact(tmp_path, model_id="m").tokenizer_dir == tmp_path / "tensorrt_llm" / "1"


def test_trtllm_checkpoint(tmp_path):
    make(tmp_path, {"config.json": CKPT_CONFIG, "rank0.safetensors": "w", "rank1.safetensors": "w"})
    a = detect_artifact(tmp_path, model_id="m")
    assert (a.kind, a.engine_dir, a.hf_config) == ("trtllm_checkpoint", None, None)


def test_checkpoint_one_level_deeper(tmp_path):
    make(
        tmp_path,
        {"serving.properties": "option.model_id=x", "llama/config.json": HF_CONFIG, "llama/model.safetensors": "w"},
    )
    a = detect_artifact(tmp_path, model_id="m")
    assert (a.kind, a.path) == ("hf_checkpoint", tmp_path / "llama")


def test_engine_beside_checkpoint_wins(tmp_path):
    make(
        tmp_path,
        {
            "hf/config.json": HF_CONFIG,
            "hf/model.safetensors": "w",
            "engine/config.json": ENGINE_CONFIG,
            "engine/rank0.engine": "e",
        },
    )
    assert detect_artifact(tmp_path, model_id="m").engine_dir == tmp_path / "engine"


def test_two_models_are_ambiguous(tmp_path):
    make(
        tmp_path,
        {
            "a/config.json": HF_CONFIG,
            "a/model.safetensors": "w",
            "b/config.json": HF_CONFIG,
            "b/model.safetensors": "w",
        },
    )
    with pytest.raises(SourceError, match=r"more than one model \(a/ \(hf_checkpoint\), b/ \(hf_checkpoint\)\)"):
        detect_artifact(tmp_path, model_id="m")


def test_hidden_folders_are_ignored(tmp_path):
    make(
        tmp_path,
        {
            "config.json": HF_CONFIG,
            "model.safetensors": "w",
            ".cache/huggingface/x/config.json": ENGINE_CONFIG,
            ".cache/huggingface/x/rank0.engine": "e",
        },
    )
    assert detect_artifact(tmp_path, model_id="m").kind == "hf_checkpoint"


# --- errors --------------------------------------------------------------------------------------


def test_unrecognised_folder_says_what_was_looked_for_and_found(tmp_path):
    make(tmp_path, {"README.md": "hi", "weights.gguf": "w", "sub/notes.txt": "x"})
    with pytest.raises(SourceError) as e:
        detect_artifact(tmp_path, model_id="acme/odd")
    msg = str(e.value)
    assert "'acme/odd'" in msg and str(tmp_path) in msg
    assert "rank*.engine" in msg and "config.pbtxt" in msg and "*.safetensors" in msg  # looked for
    assert "README.md" in msg and "weights.gguf" in msg and "sub/" in msg  # found


def test_hf_config_without_weights_is_explained(tmp_path):
    make(tmp_path, {"config.json": HF_CONFIG, **TOKENIZER})
    with pytest.raises(SourceError, match="HF config but no"):
        detect_artifact(tmp_path, model_id="m")


def test_triton_folder_without_engines_is_explained(tmp_path):
    make(tmp_path, {"tensorrt_llm/config.pbtxt": "x", "tensorrt_llm/1/model.py": "x"})
    with pytest.raises(SourceError, match=r"config.pbtxt is there but no numbered sub-folder"):
        detect_artifact(tmp_path, model_id="m")


def test_engines_without_config_json(tmp_path):
    make(tmp_path, {"rank0.engine": "e"})
    with pytest.raises(SourceError, match="no config.json beside it"):
        detect_artifact(tmp_path, model_id="m")


def test_engine_names_that_do_not_match_config(tmp_path):
    make(tmp_path, {"config.json": LEGACY_CONFIG, "rank0.engine": "e"})
    with pytest.raises(SourceError, match="do not match its config.json"):
        detect_artifact(tmp_path, model_id="m")


def test_not_a_folder(tmp_path):
    with pytest.raises(SourceError, match="is not a folder"):
        detect_artifact(tmp_path / "missing", model_id="m")


def test_broken_config_json(tmp_path):
    make(tmp_path, {"config.json": "{not json", "model.safetensors": "w"})
    with pytest.raises(SourceError, match="not readable JSON"):
        detect_artifact(tmp_path, model_id="m")


# --- fingerprint ---------------------------------------------------------------------------------


def test_local_fingerprint_tracks_names_sizes_mtimes_and_ignores_hidden(tmp_path):
    make(tmp_path, {"config.json": HF_CONFIG, "model.safetensors": "w"})
    first = local_fingerprint(tmp_path)
    assert local_fingerprint(tmp_path) == first
    make(tmp_path, {".cache/x": "y", ".lock": ""})
    assert local_fingerprint(tmp_path) == first
    (tmp_path / "model.safetensors").write_text("ww")
    second = local_fingerprint(tmp_path)
    assert second != first
    make(tmp_path, {"extra.json": {}})
    assert local_fingerprint(tmp_path) != second


# --- path sanitising -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, rel",
    [
        ("a/b.json", "a/b.json"),
        ("/etc/passwd", "etc/passwd"),  # absolute → relative to the destination
        ("a//b/./c", "a/b/c"),
    ],
)
def test_safe_relpath_keeps_names_inside(name, rel, tmp_path):
    out = safe_relpath(name)
    assert out == PurePosixPath(rel)
    assert (tmp_path / out).resolve().is_relative_to(tmp_path.resolve())


@pytest.mark.parametrize("name", ["../x", "a/../../x", "a/..", "", "/", "a\\..\\b", "a/\0b"])
def test_safe_relpath_refuses_escapes(name):
    with pytest.raises(SourceError, match="outside the download folder"):
        safe_relpath(name)


def test_s3_uri_parsing_and_cache_dir(tmp_path):
    assert parse_s3_uri("s3://bucket/a/b") == parse_s3_uri("s3://bucket/a/b/") == parse_s3_uri("s3://bucket//a/b")
    assert parse_s3_uri("s3://bucket/a/b").prefix == "a/b/"
    assert parse_s3_uri("s3://bucket").prefix == ""
    for bad in ("s3://", "s3:///x", "gs://bucket/x"):
        with pytest.raises(SourceError, match="s3://bucket/prefix"):
            parse_s3_uri(bad)
    # The cache folder is a hash: the same for both spellings, and never outside download_dir.
    dest = cache_dir_for(tmp_path, parse_s3_uri("s3://../../etc/../.."))
    assert dest.parent == tmp_path / "s3" and len(dest.name) == 16
    assert cache_dir_for(tmp_path, parse_s3_uri("s3://b/p")) == cache_dir_for(tmp_path, parse_s3_uri("s3://b/p/"))


def test_s3_local_paths_strip_prefix_and_refuse_collisions():
    uri = parse_s3_uri("s3://b/models/llama")
    objs = [S3Object("models/llama/config.json", "e1", 2), S3Object("models/llama/1/rank0.engine", "e2", 3)]
    assert set(local_paths(uri, objs)) == {PurePosixPath("config.json"), PurePosixPath("1/rank0.engine")}
    with pytest.raises(SourceError, match="would both be written to a/b"):
        local_paths(uri, [S3Object("models/llama/a/b", "e", 1), S3Object("models/llama/a//b", "e", 1)])
    with pytest.raises(SourceError, match="outside the download folder"):
        local_paths(uri, [S3Object("models/llama/../../../etc/passwd", "e", 1)])
    with pytest.raises(SourceError, match="reserved"):
        local_paths(uri, [S3Object(f"models/llama/{MANIFEST}", "e", 1)])


def test_s3_listing_fingerprint_changes_with_etag_and_ignores_order():
    a, b = S3Object("k1", "e1", 1), S3Object("k2", "e2", 2)
    assert listing_fingerprint([a, b]) == listing_fingerprint([b, a])
    assert listing_fingerprint([a, b]) != listing_fingerprint([a, S3Object("k2", "e3", 2)])


# --- hub file selection --------------------------------------------------------------------------

REPO = [
    ".gitattributes",
    "README.md",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "original/consolidated.00.pth",
    "modeling_x.py",
    "onnx/model.onnx",
    "training_args.bin",
]


def test_hub_prefers_safetensors_and_skips_the_rest():
    assert select_hub_files(REPO, trust_remote_code=False) == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


def test_hub_bin_only_when_no_safetensors_and_code_only_when_trusted():
    repo = [n for n in REPO if "safetensors" not in n]
    chosen = select_hub_files(repo, trust_remote_code=True)
    assert "pytorch_model.bin" in chosen and "pytorch_model.bin.index.json" in chosen
    assert "modeling_x.py" in chosen
    assert "training_args.bin" not in chosen and "original/consolidated.00.pth" not in chosen
    assert "modeling_x.py" not in select_hub_files(repo, trust_remote_code=False)


def test_hub_engine_repo_takes_nested_engines_not_foreign_weights():
    repo = [
        "tensorrt_llm/config.pbtxt",
        "tensorrt_llm/1/rank0.engine",
        "tensorrt_llm/1/config.json",
        "tensorrt_llm/tokenizer.json",
        "tensorrt_llm/1/rank0_managed_weights.safetensors",
        "hf/pytorch_model.bin",
        "preprocessing/1/model.py",
    ]
    assert select_hub_files(repo, trust_remote_code=False) == [
        "tensorrt_llm/1/config.json",
        "tensorrt_llm/1/rank0.engine",
        "tensorrt_llm/1/rank0_managed_weights.safetensors",
        "tensorrt_llm/config.pbtxt",
        "tensorrt_llm/tokenizer.json",
    ]


def test_hub_tokenizer_only():
    assert select_hub_files(REPO, trust_remote_code=False, tokenizer_only=True) == [
        "chat_template.jinja",
        "config.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


# --- resolve_model / resolve_tokenizer without remote sources -------------------------------------


def test_model_dir_is_the_model_when_no_model_id(tmp_path):
    make(tmp_path, {"serving.properties": "engine=Python", "config.json": HF_CONFIG, "model.safetensors": "w"})
    a = resolve_model(LmiConfig(model_dir=tmp_path, download_dir=tmp_path / "dl"))
    assert (a.kind, a.source, a.path) == ("hf_checkpoint", "local", tmp_path)


@pytest.mark.parametrize(
    "model_id, msg",
    [
        ("./no/such/folder", "local folder './no/such/folder' does not exist"),
        ("/no/such/folder", "does not exist"),
        ("gs://bucket/model", "unsupported URI scheme"),
        ("not a//valid id", "not an existing local folder, an s3:// URI, or a valid Hugging Face repo id"),
    ],
)
def test_bad_model_ids(model_id, msg, tmp_path):
    with pytest.raises(SourceError, match=msg):
        resolve_model(LmiConfig(model_id=model_id, download_dir=tmp_path))


def test_model_id_naming_a_file(tmp_path):
    make(tmp_path, {"model.safetensors": "w"})
    with pytest.raises(SourceError, match="is a file"):
        resolve_model(LmiConfig(model_id=str(tmp_path / "model.safetensors"), download_dir=tmp_path))


@pytest.mark.parametrize("model_id", ["./no/such/folder", "gs://bucket/model", "model.safetensors"])
def test_preflight_the_load_and_plan_recognise_a_model_id_alike(model_id, tmp_path, monkeypatch):
    # Issue 25: preflight, the sources stage and `lmi-trt plan` each told what a model id is, with their own
    # messages; now one place does (sources.locate), so the three refuse a bad id with the same words.
    from lmi_trt.cli.plan import fetch_hf_config
    from lmi_trt.sources import peek

    make(tmp_path, {"model.safetensors": "w"})
    monkeypatch.chdir(tmp_path)
    config = LmiConfig(model_id=model_id, download_dir=tmp_path / "dl")
    said = set()
    for ask in (peek, resolve_model, fetch_hf_config):
        with pytest.raises(SourceError) as e:
            ask(config)
        said.add(str(e.value))
    assert len(said) == 1 and "option.model_id" in said.pop()


def test_no_model_at_all(tmp_path):
    with pytest.raises(SourceError, match="set option.model_id"):
        resolve_model(LmiConfig(download_dir=tmp_path))


def test_engine_without_tokenizer_needs_tokenizer_id(tmp_path):
    engine = make(tmp_path / "engine", {"config.json": ENGINE_CONFIG, "rank0.engine": "e"})
    config = LmiConfig(model_id=str(engine), download_dir=tmp_path / "dl")
    artifact = resolve_model(config)
    with pytest.raises(SourceError, match="this engine folder has no tokenizer files; set option.tokenizer_id"):
        resolve_tokenizer(config, artifact)
    # A local tokenizer_id (uploaded one folder deeper) fixes it.
    make(tmp_path / "tok", {"llama/tokenizer.json": "{}"})
    fixed = config.model_copy(update={"tokenizer_id": str(tmp_path / "tok")})
    assert resolve_tokenizer(fixed, artifact) == tmp_path / "tok" / "llama"
    empty = config.model_copy(update={"tokenizer_id": str(tmp_path / "engine")})
    with pytest.raises(SourceError, match="option.tokenizer_id .* no tokenizer files"):
        resolve_tokenizer(empty, artifact)


@pytest.mark.parametrize(
    "code, status, expected",
    [
        ("AccessDenied", 403, "access denied while listing s3://b/p/; the credentials in use need s3:ListBucket"),
        ("InvalidAccessKeyId", 403, "AWS credentials rejected while listing s3://b/p/ (InvalidAccessKeyId)"),
        ("NoSuchBucket", 404, "bucket 'b' does not exist (s3://b/p/)"),
        ("SlowDown", 503, "S3 error while listing s3://b/p/: SlowDown"),
    ],
)
def test_s3_error_messages(code, status, expected):
    """botocore's own ClientError as S3 returns it (a local server does not enforce IAM)."""
    from botocore.exceptions import ClientError

    from lmi_trt.sources.s3 import _explain

    error = ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "ListObjectsV2"
    )
    assert str(_explain(parse_s3_uri("s3://b/p"), error, "listing")).startswith(expected)
