"""The release soaked long: no false alarm on every page size and tree core, and what
`--coverage` costs.

    python bench/soak_release.py [--wheel W] [--steps 5000] [--page-sizes 1,4,16,32,64]
                                 [--layout swa|unified|mamba]

For each page size and tree core, one `kvcanary soak` of `--steps` steps (the command's own
`soak()`, the default workload: aborts, release-prefill-SWA and SWA eviction intervals in
turn) on SGLang's release; it prints the histories, steps, audits, what kvcanary and SGLang's
checks found (both must be nothing), CPU seconds, and with --coverage the free paths reached
of those the layout has. Then the same
soak of `--overhead-steps` steps on page size 4, with and without `--coverage`, for the
tracer's cost.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvcanary_cli.soak.command import soak  # noqa: E402


def _wheel() -> str:
    from tests.sglang_wheel import wheel_path

    path = wheel_path()
    if path is None:
        sys.exit("no SGLang 0.5.23 wheel: give --wheel")
    return str(path)


def _one(
    tree: str, steps: int, page_size: int, core: str, coverage: bool, layout: str = "swa"
) -> tuple[object, float]:
    with tempfile.TemporaryDirectory() as folder:
        started = time.process_time()
        report = soak(
            sglang_tree=tree,
            steps=steps,
            seed=0,
            page_size=page_size,
            core=core,
            out=Path(folder) / "out",
            coverage=coverage,
            layout=layout,
        )
        return report, time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", default=None)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--page-sizes", default="1,4,16,32,64")
    parser.add_argument("--cores", default="python,rust")
    parser.add_argument("--overhead-steps", type=int, default=1000)
    parser.add_argument("--layout", default="swa", help="swa, unified or mamba (page size 1)")
    parser.add_argument("--coverage", action="store_true", help="trace the long soaks too")
    args = parser.parse_args()
    tree = args.wheel or _wheel()
    bad = 0
    print("page core  histories  steps  audited  kvcanary  sglang  cpu_s  free paths reached")
    for page_size in map(int, args.page_sizes.split(",")):
        for core in args.cores.split(","):
            report, cpu = _one(
                tree, args.steps, page_size, core, coverage=args.coverage, layout=args.layout
            )
            covered = report.coverage  # type: ignore[attr-defined]
            reached = (
                f"{len(covered.reached)}/{len(covered.reached) + len(covered.not_reached)}"
                if covered
                else "-"
            )
            found = report.kvcanary_found  # type: ignore[attr-defined]
            complained = report.sglang_found  # type: ignore[attr-defined]
            bad += found or complained
            print(
                f"{page_size:4} {core:6} {report.histories:9} {report.steps:6} "  # type: ignore[attr-defined]
                f"{report.audited_steps:8} {'FOUND' if found else 'none':>8} "  # type: ignore[attr-defined]
                f"{'FOUND' if complained else 'none':>6} {cpu:6.1f}  {reached}",
                flush=True,
            )
    if args.overhead_steps:
        plain = _one(tree, args.overhead_steps, 4, "python", coverage=False)[1]
        traced = _one(tree, args.overhead_steps, 4, "python", coverage=True)[1]
        print(
            f"--coverage on {args.overhead_steps} steps (page 4, python core): "
            f"{plain:.1f} s CPU without, {traced:.1f} s with ({traced / plain:.2f}x)"
        )
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
