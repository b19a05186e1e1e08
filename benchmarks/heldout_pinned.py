"""autopar's plans pinned into the development and evaluation jobs and compiled by OneFlow (issue 26).

Run in the OneFlow venv (with ``AUTOPAR_PYTHON`` naming the main venv's Python, which
solves), on the jobs ``benchmarks/heldout_truth.py``'s build commands write to OUT::

    python -m benchmarks.heldout_pinned plan OUT     # autopar plans every job: OUT/{job}.plan.json
    python -m oneflow.distributed.launch --nproc_per_node 8 tests/oneflow/_pin_families.py OUT
    python -m benchmarks.heldout_pinned table OUT    # the table below

Jobs: ``OUT/{family}_zero2.pb`` (``_build_heldout_families.py``) and
``OUT/{name}_min1024.pb`` (``_build_heldout.py``), all at OneFlow's default ZeRO-2
(``shard_min_size`` 1024).  ``plan`` solves each on ``[4, 2]`` of ``1x8`` ``a100-40g``,
ZeRO-2, the runtime the job was built for (:func:`autopar.bridges.oneflow.plans.job_runtime`).
``table`` reads what ``_pin_families.py`` wrote: per job, its split (development rows
are in-sample, evaluation rows held out), the compile attempts, the op types OneFlow
refused to take pinned (``compile_with_plan`` then leaves them to OneFlow's inference),
and the share of the compiled job's ops whose signature is the plan's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TIME_LIMIT_S = 30.0


def jobs(out: Path) -> list[str]:
    """The built jobs in ``out``: ``{family}_zero2`` and ``{name}_min1024``, sorted."""
    names = [p.name[:-3] for p in out.glob("*_zero2.pb")] + [p.name[:-3] for p in out.glob("*_min1024.pb")]
    return sorted(names)


def split_of(job: str) -> str:
    """``development`` or ``evaluation``: the frozen split of ``examples/oneflow/heldout``."""
    sys.path.insert(0, str(ROOT / "examples" / "oneflow"))
    from heldout import SPLIT
    from heldout.families import SPLIT as FAMILY_SPLIT

    name = job.removesuffix("_zero2").removesuffix("_min1024")
    return {**SPLIT, **FAMILY_SPLIT}[name]


def plan_job(
    out: Path,
    job: str,
    runtime: str | None = None,
    stem: str | None = None,
    time_limit_s: float = TIME_LIMIT_S,
) -> None:
    """autopar's plan of ``out/{job}.pb`` on ``[4, 2]`` of ``1x8``, ZeRO-2, written to
    ``out/{stem}.plan.json`` (``stem`` defaults to ``job``), on ``runtime`` (default: the
    one the job was built for, :func:`autopar.bridges.oneflow.plans.job_runtime`)."""
    from autopar.bridges.oneflow import import_job, load_job
    from autopar.bridges.oneflow.planning import request_plan
    from autopar.bridges.oneflow.plans import job_runtime

    proto = load_job(out / f"{job}.pb")
    graph_path = out / f"{job}.graph.json"
    import_job(proto).save(str(graph_path))
    request_plan(
        str(graph_path),
        str(out / f"{stem or job}.plan.json"),
        mesh_shape=[4, 2],
        cluster="1x8",
        zero_stage=2,
        time_limit_s=time_limit_s,
        runtime=runtime or job_runtime(proto),
    )


def plan_all(out: Path) -> None:
    for job in jobs(out):
        plan_job(out, job)
        print(f"{job}: planned", flush=True)


def rows(out: Path) -> list[dict[str, Any]]:
    result = []
    for job in jobs(out):
        pinned = out / f"{job}.pinned.json"
        if not pinned.exists():
            continue
        plan = json.loads((out / f"{job}.plan.json").read_text())
        result.append(
            {
                "job": job,
                "split": split_of(job),
                "gap": plan.get("solver", {}).get("gap"),
                **json.loads(pinned.read_text()),
            }
        )
    return result


def table(out: Path) -> str:
    lines = [
        "| job | split | solver gap | attempts | ops pinned | refused (left to OneFlow) | ops as planned |",
        "|---|---|---:|---:|---:|---|---:|",
    ]
    for r in sorted(rows(out), key=lambda r: (r["split"], r["job"])):
        gap = "-" if r["gap"] is None else f"{100 * r['gap']:.2f} %"
        if "error" in r:
            lines.append(
                f"| {r['job']} | {r['split']} | {gap} | - | - | "
                f"OneFlow did not compile: {r['error'][:120]} | - |"
            )
            continue
        lines.append(
            f"| {r['job']} | {r['split']} | {gap} | {r['attempts']} | {r['pinned_ops']} | "
            f"{', '.join(r['rejected']) or 'none'} | {r['ops_matched']}/{r['ops_total']} "
            f"({100 * r['op_share']:.1f} %) |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("step", choices=("plan", "table"))
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    if args.step == "plan":
        plan_all(args.out)
    else:
        print(table(args.out))
        for r in rows(args.out):
            for m in r.get("mismatches", [])[:5]:
                print(f"  {r['job']}: {m}")


if __name__ == "__main__":
    main()
