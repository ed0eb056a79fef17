"""A benchmark script run once per round and variant, interleaved, each variant's tree first on ``PYTHONPATH``.

A shared host's load drifts over minutes: running the variants in turn within each round (round 1: A, B; round 2:
A, B; ...) gives each the same share of that drift, and the medians over the rounds compare them. The ``--trees``
modes of ``loop_host.py`` and ``serving_cost.py`` run on this; each prints its own table.
"""

from __future__ import annotations

import os
import subprocess
import sys


def interleaved(script: str, variants: dict[str, tuple[str, list[str]]], rounds: int) -> dict[str, list[str]]:
    """The standard output of each run of ``python SCRIPT ARGS``, by variant, in round order.

    ``variants`` maps a name to ``(tree, ARGS)``: ``tree`` (a folder holding an ``lmi_trt``, "" for none) goes
    first on ``PYTHONPATH``. Each round runs every variant once, in the mapping's order, and says so on standard
    error; the runs' standard error passes through, and a run that fails raises ``CalledProcessError``.
    """
    outputs: dict[str, list[str]] = {name: [] for name in variants}
    for r in range(rounds):
        for name, (tree, args) in variants.items():
            env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, (tree, os.environ.get("PYTHONPATH"))))}
            run = subprocess.run(
                [sys.executable, script, *args], env=env, check=True, stdout=subprocess.PIPE, text=True
            )
            outputs[name].append(run.stdout)
            print(f"round {r + 1}/{rounds}: {name} done", file=sys.stderr, flush=True)
    return outputs
