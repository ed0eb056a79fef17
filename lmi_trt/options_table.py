"""README.md's options table, generated from the configuration's registry.

``python -m lmi_trt.options_table`` rewrites the table between the options markers in README.md;
tests/unit/test_config.py fails when the README is stale.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lmi_trt.config import REGISTRY, KeySpec, LmiConfig, jsonable

README_START = "<!-- options:start -->"
README_END = "<!-- options:end -->"


def render_options_table() -> str:
    """A Markdown table of every key: name, environment variables, default, compile-time, description."""
    rows = ["| Key | Environment | Default | Compile-time | Description |", "|---|---|---|---|---|"]
    for spec in REGISTRY:
        env = ", ".join(f"`{v}`" for v in spec.env_names()) or "—"
        if spec.attr is None:
            default, compile_time = "—", "—"
        else:
            default_value = jsonable(LmiConfig.model_fields[spec.attr].default)
            default = "—" if default_value is None else f"`{_plain(default_value)}`"
            compile_time = "yes" if spec.compile_time else "no"
        rows.append(
            "| " + " | ".join(_cell(c) for c in (f"`{spec.key}`", env, default, compile_time, _describe(spec))) + " |"
        )
    return "\n".join(rows)


def _plain(value: Any) -> str:
    """true/false like the properties file, numbers and strings as they are."""
    return json.dumps(value) if isinstance(value, bool) else str(value)


def _describe(spec: KeySpec) -> str:
    text = spec.description[0].upper() + spec.description[1:] + "."
    if spec.ignored:
        text = f"Ignored: {spec.ignored}. ({text})"
    if spec.refused:
        text = f"Refused (startup error): {spec.refused}. ({text})"
    text += f" {spec.type.summary[0].upper()}{spec.type.summary[1:]}."
    if spec.aliases:
        text += " Also: " + ", ".join(f"`{a}`" for a in spec.aliases) + "."
    return text


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def replace_options_table(readme: str) -> str:
    """README text with the table between the options markers replaced by the registry's."""
    start, end = readme.index(README_START) + len(README_START), readme.index(README_END)
    return readme[:start] + "\n" + render_options_table() + "\n" + readme[end:]


if __name__ == "__main__":
    # python -m lmi_trt.options_table  → rewrites README.md's options table from the registry.
    readme_path = Path(__file__).resolve().parents[1] / "README.md"
    readme_path.write_text(replace_options_table(readme_path.read_text()))
