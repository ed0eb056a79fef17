#!/usr/bin/env python
"""``lmi-trt serve`` on a chosen event loop, for like-for-like comparisons with bare_server.py.

``lmi-trt serve`` runs on uvloop when it is installed (``serving.app.event_loop_factory``);
this runs the same command on asyncio's own loop (or insists on uvloop):

    python benchmarks/serve_on_loop.py asyncio serve --engine synthetic --model-dir DIR
    python benchmarks/compare.py --bare-args "--loop asyncio" \\
        --serve-cmd "python benchmarks/serve_on_loop.py asyncio serve"
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lmi_trt.serving import app  # noqa: E402

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("asyncio", "uvloop", "auto"):
        sys.exit("usage: serve_on_loop.py asyncio|uvloop|auto serve ARGS...")
    app.run_app = functools.partial(app.run_app, event_loop=sys.argv[1])
    from lmi_trt.cli import main

    sys.exit(main(sys.argv[2:]))
