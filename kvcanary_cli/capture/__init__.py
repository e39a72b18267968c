"""Capture dumps from a live SGLang process: when a plan call raises, when the canary reports
violations, before the GPU kernels would clamp a bad LUT (the guard), and on request
(snapshots), and at SGLang's own memory-leak checks (`leaks`).

A plan failure (`ValueError: kv-canary: SWA slot ...`) or a canary violation is only
diagnosable with the state of that step, and it is gone once the process moves on. This
package saves it as a format-v1 dump, where the user calls it (`save_plan_inputs`) or
automatically (`install_sglang_hook`, `install_from_env`; the triggers are described in
`kvcanary_cli.capture.triggers`).

Enabling the hook without touching SGLang's code: set `KVCANARY_DUMP_DIR` and make every
interpreter import this package at start-up, which SGLang's worker processes (spawned, not
forked) inherit through the environment. Either

* put a `sitecustomize.py` containing the line ``import kvcanary_cli.capture`` in a directory
  on `PYTHONPATH` (it shadows any other `sitecustomize` on the path), or
* put a file `kvcanary-capture.pth` containing the same line in `site-packages`.

Then ``KVCANARY_DUMP_DIR=/tmp/kvcanary-dumps python -m sglang.launch_server ...``. Importing this
package costs only the standard library; with the variable set it arms an import hook that
wraps SGLang's modules as soon as SGLang loads them (SGLang itself is not imported early), so
even ``from ... import launch_canary_plan_kernels`` bindings made later get the wrapper, and
every radix tree SGLang builds registers itself (`register_tree_cache`), so dumps record what
it holds.
"""

from __future__ import annotations

import logging
import os

from kvcanary_cli.capture.launcher import (
    DUMP_DIR_ENV,
    SGLANG_PLAN_FUNCTION,
    SGLANG_PLAN_MODULE,
    install_from_env,
    install_sglang_hook,
)
from kvcanary_cli.capture.leaks import SGLANG_CHECKER_MODULE, watch_invariant_checker
from kvcanary_cli.capture.server import (
    SGLANG_CANARY_MODULE,
    SGLANG_TREE_CLASSES,
    register_canary_manager,
    register_model_runner,
    server_context,
    watch_model_runners,
    watch_tree_classes,
)
from kvcanary_cli.capture.store import (
    DEFAULT_DUMP_LIMIT,
    DEFAULT_MAX_BYTES,
    PLAN_ARGUMENTS,
    save_plan_inputs,
)
from kvcanary_cli.capture.tree import register_tree_cache
from kvcanary_cli.capture.triggers import SGLANG_REPORTER_MODULE, watch_violation_reporter

__all__ = [
    "DEFAULT_DUMP_LIMIT",
    "DEFAULT_MAX_BYTES",
    "DUMP_DIR_ENV",
    "PLAN_ARGUMENTS",
    "SGLANG_CHECKER_MODULE",
    "SGLANG_CANARY_MODULE",
    "SGLANG_PLAN_FUNCTION",
    "SGLANG_PLAN_MODULE",
    "SGLANG_REPORTER_MODULE",
    "SGLANG_TREE_CLASSES",
    "install_from_env",
    "install_sglang_hook",
    "register_canary_manager",
    "register_model_runner",
    "register_tree_cache",
    "save_plan_inputs",
    "server_context",
    "watch_invariant_checker",
    "watch_model_runners",
    "watch_tree_classes",
    "watch_violation_reporter",
]

if os.environ.get(DUMP_DIR_ENV, "").strip():
    try:
        install_from_env()
    except Exception as exc:  # arming never breaks the program that imports this (SGLang)
        logging.getLogger("kvcanary.capture").warning(
            "kvcanary: the capture hook is not armed (%s: %s)", type(exc).__name__, exc
        )
