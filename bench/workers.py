"""Tasks the benchmark runs in child processes of their own: `python bench/workers.py TASK ...`.

- `scan DUMP SLOT`: the floor of `provenance --slot`: one chunked pass over `req_to_token` for
  the cells holding SLOT, in a bare process (numpy and the standard library; the safetensors
  header is parsed by hand). Prints the number of cells as JSON.
- `sglang ROOT DUMP`: SGLang's own torch reference planner on each group of DUMP, called as
  SGLang calls it (one launcher call per group, the inputs as production passes them), ROOT
  first on `sys.path` ("": the installed SGLang). Prints the seconds per call as JSON.
- `modules OUT -- ARGS...`: `kvcanary ARGS` in this process, then writes to OUT (JSON) whether
  it imported torch, triton and numpy.

Imports stay inside each task, so that a task pays only for what it uses.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

#: Rows of the table one scan step reads (capped at about 64 MiB).
_SCAN_BYTES = 64 << 20


def scan(path: Path, slot: int) -> dict[str, int]:
    """Cells of `req_to_token` holding `slot`: one pass, 64 MiB at a time."""
    import numpy as np

    with path.open("rb") as f:
        length = int.from_bytes(f.read(8), "little")
        entry = json.loads(f.read(length))["req_to_token"]
        dtype = np.dtype({"I32": "<i4", "I64": "<i8"}[entry["dtype"]])
        rows, cols = entry["shape"]
        f.seek(8 + length + entry["data_offsets"][0])
        step = min(rows, max(1, _SCAN_BYTES // (cols * dtype.itemsize)))
        buffer = bytearray(step * cols * dtype.itemsize)
        found, first_row = 0, -1
        for start in range(0, rows, step):
            n = min(step, rows - start)
            view = memoryview(buffer)[: n * cols * dtype.itemsize]
            f.readinto(view)
            hits = np.flatnonzero(np.frombuffer(view, dtype=dtype) == slot)
            if hits.size and first_row < 0:
                first_row = start + int(hits[0]) // cols
            found += int(hits.size)
    return {"cells": found, "first_row": first_row}


def sglang(root: str, path: Path) -> dict[str, object]:
    """SGLang's reference launcher on each group of the dump: seconds per call, and its raise."""
    if root:
        sys.path.insert(0, root)
    import torch

    from kvcanary_cli.dump.loader import load_dump
    from kvcanary_cli.planners.frame import group_frame
    from kvcanary_cli.planners.sglang_planner import plan_arguments
    from kvcanary_cli.planners.sglang_runtime import load_reference_launcher

    start = time.perf_counter()
    launcher = load_reference_launcher(option="bench")
    loaded = time.perf_counter() - start
    dump = load_dump(path)
    device = torch.device("cpu")
    groups: dict[str, object] = {}
    for group in dump.groups:
        arguments = plan_arguments(launcher, dump, group_frame(dump, group), device)
        start = time.perf_counter()
        raised = None
        try:
            launcher.launch(**arguments)
        except Exception as exc:  # SGLang's raise is a result here, not a failure
            raised = f"{type(exc).__name__}: {exc}"
        groups[group] = {"seconds": time.perf_counter() - start, "raised": raised}
    return {
        "version": launcher.version,
        "where": launcher.where,
        "import_seconds": loaded,
        "torch_threads": torch.get_num_threads(),
        "groups": groups,
    }


def modules(out: Path, args: list[str]) -> None:
    """Run `kvcanary ARGS` here, then record which heavy modules it imported."""
    from kvcanary_cli.cli import main

    try:
        main(args)
    except SystemExit:
        pass
    finally:
        imported = {name: name in sys.modules for name in ("torch", "triton", "numpy")}
        out.write_text(json.dumps(imported))


def _main(argv: list[str]) -> None:
    task, rest = argv[0], argv[1:]
    if task == "scan":
        print(json.dumps(scan(Path(rest[0]), int(rest[1]))))
    elif task == "sglang":
        print(json.dumps(sglang(rest[0], Path(rest[1]))))
    elif task == "modules":
        modules(Path(rest[0]), rest[rest.index("--") + 1 :])
    else:
        sys.exit(f"unknown task {task!r}")


if __name__ == "__main__":
    _main(sys.argv[1:])
