"""Configuration: serving.properties + OPTION_*/HF_*/SERVING_* env + CLI overrides → LmiConfig.

DJL-Serving LMI semantics: a key in ``serving.properties`` wins over the environment (Java's
``putIfAbsent``), CLI overrides win over both. The environment rules, including the TGI/SageMaker
aliases that apply only while the LMI variable is unset, follow DJL's ``ModelInfo``, ``ConfigManager``,
``SageMakerCompatibility`` and its container entrypoint. This is the only module that reads
``os.environ`` (in ``load_config_from_environment``); everything else is pure over a mapping.

Every key is declared once, in ``lmi_trt.keys`` (an ``LmiConfig`` field annotated with its ``KeySpec``); this
module reads the three sources by those declarations, checks what no single key can, and logs the result.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmi_trt.engines.registry import ENGINE_NAMES, entry
from lmi_trt.errors import ConfigError
from lmi_trt.errors import StartupError as StartupError  # the configuration's errors, importable from it
from lmi_trt.keys import (
    _BY_NAME,
    ENV_ALIASES,
    REGISTRY,
    KeySpec,
    LmiConfig,
    _BadValue,
    jsonable,
    key_of,
)
from lmi_trt.log_redaction import MASK, is_secret_name
from lmi_trt.properties import PropertiesSyntaxError, iter_properties
from lmi_trt.speculative import FLAT_FIELDS, Speculation, SpeculationError, resolve
from lmi_trt.spelling import did_you_mean, within_a_typo
from lmi_trt.vocabulary import Quantization

log = logging.getLogger(__name__)

PROPERTIES_FILE_NAME = "serving.properties"


# Truss nests these; in a properties file they are a JSON object: plugin_configuration={"paged_kv_cache": true}
_GROUP_KEYS = ("plugin_configuration", "quantization_config")


# --------------------------------------------------------------------------------------------
# Gathering raw settings from the three sources.


@dataclass(frozen=True)
class _Setting:
    name: str  # as the user wrote it: a properties key, an env variable or an override key
    spec: KeySpec
    value: str
    origin: str  # "serving.properties", "env" or "override"
    rank: int = 0  # within one source, the lowest rank wins (env aliases rank behind OPTION_*/SERVING_*)

    @property
    def label(self) -> str:
        """The key as written, with the key it sets when that differs."""
        return self.name if self.name == self.spec.key else f"{self.name} ({self.spec.key})"

    @property
    def shown_value(self) -> str:
        return MASK if is_secret_name(self.name) or self.spec.secret else self.value


def _lookup(name: str, *, bare_means_option: bool) -> KeySpec | None:
    if name in _BY_NAME:
        return _BY_NAME[name]
    if bare_means_option and not name.startswith("option."):
        return _BY_NAME.get(f"option.{name}")
    return None


def _group_members(written: str, value: str, origin: str) -> list[tuple[str, str]]:
    """plugin_configuration={"use_paged_context_fmha": true} → [("use_paged_context_fmha", "true")]."""
    try:
        members = json.loads(value)
    except json.JSONDecodeError:
        members = None
    if not isinstance(members, dict):
        raise ConfigError(
            f"{written}={value!r} ({origin}) is not a JSON object; "
            'write e.g. plugin_configuration={"use_paged_context_fmha": true}'
        )
    return [(k, json.dumps(v) if isinstance(v, bool) else str(v)) for k, v in members.items()]


def _settings_from(entries: Iterable[tuple[str, str, str]], origin: str, *, bare_means_option: bool) -> list[_Setting]:
    """``(as written, key, value)`` entries of one source → settings; unknown keys are warned about."""
    out: list[_Setting] = []
    for written, key, value in entries:
        group = key.removeprefix("option.")
        if group in _GROUP_KEYS:
            members = _group_members(written, value, origin)
            out += _settings_from(
                ((f"{written}.{m}", f"{group}.{m}", v) for m, v in members), origin, bare_means_option=False
            )
            continue
        spec = _lookup(key, bare_means_option=bare_means_option)
        if spec is None:
            _refuse_typo(written, key, origin)
            _warn_unknown(written, key, value, origin)
        else:
            out.append(_Setting(written, spec, value, origin))
    return out


def _file_settings(path: Path) -> list[_Setting]:
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")  # what Java's Properties.load(InputStream) assumes
    try:
        entries = list(iter_properties(text))
    except PropertiesSyntaxError as e:
        raise ConfigError(f"{path}: {e}") from None
    first_line: dict[str, int] = {}
    for line, key, _ in entries:
        if key in first_line:
            log.warning("%s: %s is set on lines %d and %d; the last one wins", path, key, first_line[key], line)
        first_line[key] = line
    last = {key: value for _, key, value in entries}
    return _settings_from(((k, k, v) for k, v in last.items()), PROPERTIES_FILE_NAME, bare_means_option=False)


def env_key(var: str) -> str | None:
    """DJL's generic rule: OPTION_FOO_BAR → option.foo_bar, SERVING_FOO → foo; None for other variables.

    The rest after OPTION_ is lower-cased only when it is all [A-Z_0-9] (mixed case is kept);
    OPTION_ENGINE sets the plain key ``engine``, OPTION_ENTRYPOINT sets ``option.entryPoint``.
    """
    if var.startswith("OPTION_") and len(var) > len("OPTION_"):
        rest = var[len("OPTION_") :]
        if re.fullmatch(r"[A-Z_0-9]+", rest):
            rest = rest.lower()
        if rest == "engine":
            return "engine"
        return "option." + ("entryPoint" if rest == "entrypoint" else rest)
    if var.startswith("SERVING_") and len(var) > len("SERVING_"):
        return var[len("SERVING_") :].lower()
    return None


def _env_settings(env: Mapping[str, str]) -> list[_Setting]:
    generic = (
        (var, key, env[var]) for var in sorted(env) if (key := env_key(var)) is not None and env[var].strip()
    )  # DJL ignores empty values
    out = _settings_from(generic, "env", bare_means_option=False)
    for rank, alias in enumerate(ENV_ALIASES, start=1):
        value = env.get(alias.var, "")
        if not value.strip():
            continue
        spec = _BY_NAME[alias.key]
        try:
            converted = alias.convert(value)
        except _BadValue as e:
            raise ConfigError(f"{alias.var} ({spec.key})={value!r} {e}") from None
        out.append(_Setting(alias.var, spec, converted, "env", rank))
    return out


def _override_settings(overrides: Mapping[str, str]) -> list[_Setting]:
    # The CLI may leave out "option." (-o max_input_len=2048).
    return _settings_from(((k, k, v) for k, v in overrides.items()), "override", bare_means_option=True)


def _refuse_typo(written: str, key: str, origin: str) -> None:
    """A ConfigError for an unknown key within a typo of a key that has an effect: starting with that key's default
    instead would hide the mistake. Other unknown keys (another container's, or a typo of a key accepted and
    ignored or refused anyway, like DJL's SERVING_MIN_WORKERS for minWorkers) are warned about and ignored."""
    bare = sorted({n.removeprefix("option.") for n, spec in _BY_NAME.items() if not (spec.ignored or spec.refused)})
    near = within_a_typo(key.removeprefix("option."), bare)
    if not near:
        return
    forms = [(f"option.{n}", n) if key.startswith("option.") else (n, f"option.{n}") for n in near]
    keys = sorted({_as_written(next(f for f in pair if f in _BY_NAME), origin) for pair in forms})
    name = written if written == key else f"{written} ({key})"
    raise ConfigError(
        f"unknown key {name} ({origin}) is within a typo of {did_you_mean(keys)}: "
        f"spell it {did_you_mean(keys)}, or remove it"
    )


def _as_written(name: str, origin: str) -> str:
    """A registry name as its source spells it: the variable for the environment; an alias with its key."""
    spec = _BY_NAME[name]
    if origin == "env" and spec.env_names():
        return spec.env_names()[0]
    return name if name == spec.key else f"{name} ({spec.key})"


def _warn_unknown(written: str, key: str, value: str, origin: str) -> None:
    hint = nearest_key(key)
    # A misspelt secret (option.hf_tokn) is still a secret.
    shown = MASK if is_secret_name(written) or (hint is not None and _BY_NAME[hint].secret) else value
    name = written if written == key else f"{written} ({key})"
    if hint is None:
        advice = "see the configuration table in README.md"
    elif hint == _BY_NAME[hint].key:
        advice = f"did you mean {hint}?"
    else:
        advice = f"did you mean {hint} ({_BY_NAME[hint].key})?"
    log.warning("unknown key %s=%r (%s) is ignored; %s", name, shown, origin, advice)


def nearest_key(name: str) -> str | None:
    """The accepted name closest to a misspelt one (``option.`` added or dropped first)."""
    for candidate in (f"option.{name}", name.removeprefix("option.")):
        if candidate in _BY_NAME:
            return candidate
    # Compare without the shared "option." prefix, which would make every option.* look alike.
    bare = sorted({n.removeprefix("option.") for n in _BY_NAME})
    matches = difflib.get_close_matches(name.removeprefix("option."), bare, n=1, cutoff=0.7)
    if not matches:
        return None
    forms = (f"option.{matches[0]}", matches[0])
    return next(f for f in (forms if name.startswith("option.") else forms[::-1]) if f in _BY_NAME)


def _winners(settings: list[_Setting]) -> dict[str, _Setting]:
    """One setting per key within one source: lowest rank wins; same-rank disagreement is an error."""
    by_key: dict[str, list[_Setting]] = {}
    for s in settings:
        by_key.setdefault(s.spec.key, []).append(s)
    out: dict[str, _Setting] = {}
    for key, group in by_key.items():
        best = min(s.rank for s in group)
        top = [s for s in group if s.rank == best]
        if len({s.value.strip() for s in top}) > 1:
            both = " and ".join(f"{s.name}={s.shown_value!r}" for s in top)
            raise ConfigError(f"{top[0].origin} sets {key} twice, as {both}; keep one of them")
        out[key] = top[0]
        for shadowed in (s for s in group if s.rank > best):
            log.info(
                "%s is not applied: %s sets %s (alias variables apply only while the LMI one is unset)",
                shadowed.name,
                top[0].name,
                key,
            )
    return out


# --------------------------------------------------------------------------------------------
# Loading.


def load_config(
    *,
    properties_file: Path | None = None,
    model_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, str] | None = None,
) -> LmiConfig:
    """Merge file (wins over env), env, and CLI overrides (win over both). Pure over ``env``.

    With no ``properties_file``, ``model_dir/serving.properties`` is read when present; with a
    ``properties_file`` and no ``model_dir``, the file's folder is the model dir (DJL's layout).
    """
    env = env or {}
    properties_file, model_dir = _locate(properties_file, model_dir)
    chosen: dict[str, _Setting] = {}
    for layer in (
        _env_settings(env),
        _file_settings(properties_file) if properties_file else [],
        _override_settings(overrides or {}),
    ):
        chosen.update(_winners(layer))  # a higher source replaces the whole key (putIfAbsent, inverted)
    values = _parse_values(chosen)
    if values.get("engine") == "MPI":
        values["mpi_mode"] = True  # DJL: engine=MPI forces option.mpi_mode
    _check_cross_fields(values, chosen, model_dir)
    _warn_inapplicable(values, chosen)
    config = LmiConfig(model_dir=model_dir, **values)
    config._origins = {key: _origin_text(s) for key, s in chosen.items()}
    config._labels = {key: s.label for key, s in chosen.items() if s.name != key}
    config._env_echo = echo_environment(env)
    return config


def process_environment() -> dict[str, str]:
    """A copy of the process environment: the one place it is read (log redaction takes its secrets from here)."""
    return dict(os.environ)


def load_config_from_environment(
    properties_file: Path | None = None,
    model_dir: Path | None = None,
    overrides: Mapping[str, str] | None = None,
) -> LmiConfig:
    """``load_config`` over ``os.environ`` — the one place the process environment is read."""
    return load_config(
        properties_file=properties_file, model_dir=model_dir, env=process_environment(), overrides=overrides
    )


def _locate(properties_file: Path | None, model_dir: Path | None) -> tuple[Path | None, Path | None]:
    if model_dir is not None:
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise ConfigError(
                f"model dir {str(model_dir)!r} is not a directory; pass the folder holding "
                f"{PROPERTIES_FILE_NAME} (and the model, when option.model_id is unset)"
            )
    if properties_file is not None:
        properties_file = Path(properties_file)
        if not properties_file.is_file():
            raise ConfigError(
                f"properties file {str(properties_file)!r} does not exist; pass an existing "
                f"{PROPERTIES_FILE_NAME} or leave it out to use the model dir's"
            )
        return properties_file, model_dir if model_dir is not None else properties_file.parent
    if model_dir is not None and (model_dir / PROPERTIES_FILE_NAME).is_file():
        return model_dir / PROPERTIES_FILE_NAME, model_dir
    return None, model_dir


def _parse_values(chosen: Mapping[str, _Setting]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for s in chosen.values():
        raw = s.value.strip()
        if not raw:
            continue  # an empty value means the default, and still hides the same key from lower sources
        if s.spec.refused:
            raise ConfigError(f"{s.label}={s.shown_value!r} is not supported: {s.spec.refused}")
        try:
            value = s.spec.type.parse(raw)
        except _BadValue as e:
            raise ConfigError(f"{s.label}={s.shown_value!r} {e}") from None
        if s.spec.ignored:
            log.warning("%s=%r is accepted for compatibility and ignored: %s", s.label, s.shown_value, s.spec.ignored)
            continue
        if s.spec.attr is None:  # FIXED_KEYS: the type let only lmi-trt's own behaviour through
            log.info("%s=%r: %s", s.label, s.shown_value, s.spec.description)
            continue
        if s.spec.note:
            log.info("%s=%r: %s", s.label, s.shown_value, s.spec.note)
        values[s.spec.attr] = value
    return values


def _label(key: str, chosen: Mapping[str, _Setting]) -> str:
    return chosen[key].label if key in chosen else key


def _check_cross_fields(values: Mapping[str, Any], chosen: Mapping[str, _Setting], model_dir: Path | None) -> None:
    """Combinations no engine can honour are errors: never clip or drop a setting silently."""

    def get(attr: str) -> Any:
        return values.get(attr, LmiConfig.model_fields[attr].default)

    def name(attr: str) -> str:
        return _label(key_of(attr), chosen)

    engine = get("rolling_batch")
    if get("model_id") is None and model_dir is None and (engine not in ENGINE_NAMES or entry(engine).uses_model):
        raise ConfigError(
            "no model: set option.model_id (or HF_MODEL_ID) to a Hugging Face id, s3:// URI or "
            "local folder, or pass a model dir holding the model"
        )
    scaling_type, scaling_factor = get("rotary_scaling_type"), get("rotary_scaling_factor")
    if (scaling_type is None) != (scaling_factor is None):
        given = "rotary_scaling_type" if scaling_type is not None else "rotary_scaling_factor"
        missing = "rotary_scaling_factor" if scaling_type is not None else "rotary_scaling_type"
        raise ConfigError(
            f"{name(given)}={chosen[key_of(given)].value.strip()!r} needs {key_of(missing)} "
            "as well; set both (e.g. linear and 2.0) or neither"
        )
    max_input, max_seq = get("max_input_len"), get("max_seq_len")
    if max_seq is not None and max_seq <= max_input:
        raise ConfigError(
            f"{name('max_seq_len')}={max_seq} leaves no room for output after "
            f"{name('max_input_len')}={max_input}; set max_seq_len above max_input_len "
            f"(e.g. {max_input + get('max_output_len')}) or leave it unset"
        )
    max_tokens = get("max_num_tokens")
    if max_tokens is not None and max_tokens < max_input and not get("enable_chunked_context"):
        raise ConfigError(
            f"{name('max_num_tokens')}={max_tokens} is below {name('max_input_len')}={max_input}, "
            "so the longest prompt would not fit in one step; raise max_num_tokens to at least "
            f"{max_input}, lower max_input_len, or set option.enable_chunked_context=true"
        )
    if get("enable_reasoning") is False and get("reasoning_parser") is not None:
        raise ConfigError(
            f"{name('enable_reasoning')}=false turns reasoning parsing off, and "
            f"{name('reasoning_parser')}={get('reasoning_parser')!r} names a parser; leave one out"
        )
    batch, sequences = get("max_rolling_batch_size"), get("max_num_sequences")
    if batch is not None and sequences is not None and sequences > batch:
        raise ConfigError(
            f"{name('max_num_sequences')}={sequences} exceeds {name('max_rolling_batch_size')}={batch}, "
            "the batch size the engine is built for; lower it or raise max_rolling_batch_size"
        )
    if get("tokenizer_revision") is not None and get("tokenizer_id") is None:
        raise ConfigError(
            f"{name('tokenizer_revision')}={get('tokenizer_revision')!r} pins option.tokenizer_id's hub repo, and "
            "option.tokenizer_id is unset (the tokenizer comes with the model, at option.revision); set "
            "option.tokenizer_id too, or use option.revision"
        )
    _check_tls(get, name)
    try:
        _speculation(get, name)
    except SpeculationError as e:
        raise ConfigError(str(e)) from None
    if get("use_paged_context_fmha") is False:
        for needs in ("enable_kv_cache_reuse", "enable_chunked_context"):
            if get(needs):
                raise ConfigError(
                    f"{name(needs)}=true needs paged context attention, but "
                    f"{name('use_paged_context_fmha')}=false; drop one of them"
                )


def _speculation(get: Callable[[str], Any], name: Callable[[str], str]) -> Speculation | None:
    flat = {field: (name(attr), get(attr)) for attr, field in FLAT_FIELDS.items() if get(attr)}
    return resolve(get("speculative_config"), flat)


def speculation(config: LmiConfig) -> Speculation | None:
    """The speculative decoding ``config`` asks for (None: none), its keys merged and checked (load_config
    has refused what cannot work). Reads each field through ``config``, so a settings view that calls it
    counts them as honoured (``lmi_trt.stages.honoured``)."""
    return _speculation(lambda attr: getattr(config, attr), key_of)


def with_draft_model(config: LmiConfig, folder: Path) -> LmiConfig:
    """``config`` with the speculative draft model's id replaced by the local ``folder`` it was resolved to,
    wherever it was set (DJL does the same with option.speculative_draft_model after its download)."""
    values: dict[str, Any] = {}
    if config.speculative_draft_model is not None:
        values["speculative_draft_model"] = str(folder)
    raw = config.speculative_config or {}
    members = [m for m in raw if m in ("speculative_model", "speculative_model_dir", "model")]
    if members:
        values["speculative_config"] = {**raw, **{m: str(folder) for m in members}}
    return config.derived(f"the draft model, resolved to {folder}", **values) if values else config


def _check_tls(get: Callable[[str], Any], name: Callable[[str], str]) -> None:
    """TLS keys that only work together: a certificate needs its key (and the key its certificate);
    client verification needs the server's TLS, CA certificates and a requirement that uses them."""
    cert, key, cas, reqs = (get(a) for a in ("certificate_file", "private_key_file", "ssl_ca_certs", "ssl_cert_reqs"))
    if (cert is None) != (key is None):
        given, missing = (
            ("certificate_file", "private_key_file") if cert is not None else ("private_key_file", "certificate_file")
        )
        raise ConfigError(
            f"{name(given)}={str(get(given))!r} needs {key_of(missing)} as well: HTTPS takes the certificate "
            "and its private key; set both, or neither to serve plain HTTP"
        )
    if cert is None and (cas is not None or reqs is not None):
        given = "ssl_ca_certs" if cas is not None else "ssl_cert_reqs"
        raise ConfigError(
            f"{name(given)} verifies client certificates, which needs HTTPS; set certificate_file and "
            "private_key_file too, or remove it"
        )
    if cas is None and reqs in ("optional", "required"):
        raise ConfigError(
            f"{name('ssl_cert_reqs')}={reqs} needs option.ssl_ca_certs, the CA certificates clients are "
            "verified against; set it, or remove option.ssl_cert_reqs"
        )
    if cas is not None and reqs == "none":
        raise ConfigError(
            f"{name('ssl_cert_reqs')}=none would leave {name('ssl_ca_certs')} unused (no client certificate "
            "is asked for); set option.ssl_cert_reqs=optional or required, or remove option.ssl_ca_certs"
        )


_QUANT_KNOBS: tuple[tuple[tuple[str, ...], Callable[[Quantization | None], bool], str], ...] = (
    (
        ("smoothquant_alpha", "smoothquant_per_token", "smoothquant_per_channel", "multi_query_mode"),
        lambda q: q is Quantization.SMOOTHQUANT,
        "option.quantize=smoothquant",
    ),
    (("q_format", "awq_block_size"), lambda q: q is Quantization.AWQ, "option.quantize=awq"),
    (
        ("calib_size", "calib_batch_size", "calib_max_seq_length", "calib_dataset"),
        lambda q: q is not None and q.needs_calibration,
        "a calibrated option.quantize (not weights-only)",
    ),
    (
        ("use_fp8_context_fmha",),
        lambda q: q in (Quantization.FP8, Quantization.FP8_KV),
        "option.quantize=fp8 or fp8_kv",
    ),
)


def _warn_inapplicable(values: Mapping[str, Any], chosen: Mapping[str, _Setting]) -> None:
    quantize = values.get("quantize")
    for attrs, applies, needs in _QUANT_KNOBS:
        if applies(quantize):
            continue
        for attr in attrs:
            if attr in values:
                log.warning(
                    "%s is set but has no effect without %s (option.quantize is %s)",
                    _label(key_of(attr), chosen),
                    needs,
                    quantize.value if quantize else "unset",
                )


# --------------------------------------------------------------------------------------------
# Logging the effective configuration.

_ECHO_PREFIXES = ("OPTION_", "SERVING_", "HF_", "SM_", "SAGEMAKER_", "AWS_")
_ECHO_NAMES = frozenset({a.var for a in ENV_ALIASES} | {"CUDA_VISIBLE_DEVICES"})


def echo_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The variables that matter to configuration, with secret-looking values masked."""
    return {
        var: (MASK if is_secret_name(var) else env[var])
        for var in sorted(env)
        if var.startswith(_ECHO_PREFIXES) or var in _ECHO_NAMES
    }


def _origin_text(s: _Setting) -> str:
    """'serving.properties', 'env OPTION_X', 'override'; with an alias: 'serving.properties: max_batch_size'."""
    if s.origin == "env":
        return f"env {s.name}"
    return s.origin if s.name == s.spec.key else f"{s.origin}: {s.name}"


def log_effective_config(config: LmiConfig, logger: logging.Logger) -> None:
    """Log the effective configuration once, as one record: every key, its value and its source."""
    lines = ["effective configuration:"]
    if config.model_dir is not None:
        lines.append(f"  model_dir = {config.model_dir}")
    for spec in REGISTRY:
        if spec.attr is None:
            continue
        value = jsonable(getattr(config, spec.attr))
        default = jsonable(LmiConfig.model_fields[spec.attr].default)
        source = config._origins.get(spec.key) or ("default" if value == default else "given")
        lines.append(f"  {spec.key} = {value}  [{source}]")
    if config._env_echo:
        lines.append("environment:")
        lines += [f"  {var}={value}" for var, value in config._env_echo.items()]
    logger.info("%s", "\n".join(lines))
