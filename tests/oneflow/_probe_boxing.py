"""Compile one tiny job per N-D SBP transition and record what OneFlow inserted (e.g. 4 ranks, [2, 2]).

Run by ``test_boxing_observed.py`` (and by hand) as ``python -m
oneflow.distributed.launch --nproc_per_node N _probe_boxing.py OUT.json [SHAPE [HIERARCHY]]``
(``SHAPE`` ``8,16``, ``HIERARCHY`` ``2,2``; N = the product of the hierarchy).
For every transition ``src -> dst`` of :data:`TRANSITIONS` a ``nn.Graph``
reads a ``(B, B)`` input, casts it to ``src`` (an identity op then produces
``src``), casts that to ``dst`` and reads it with an identity.  The graph is
built and compiled (``finish_complie_and_init_runtime``); rank 0 records the
ops OneFlow put on the edge ``src -> dst`` of the compiled job (the
``System-Boxing-Middle-Identity`` nodes of ``BoxingWithMiddleNodes``, with their
N-D SBP) and whether compilation succeeded.
"""

import json
import sys

import oneflow as flow

TRANSITIONS = [
    # axis 1 only (axis 0 equal): IntraGroupSubTskGphBuilder
    ("(S(0), P)", "(S(0), B)"),
    ("(S(0), P)", "(S(0), S(1))"),
    ("(S(0), S(1))", "(S(0), B)"),
    ("(S(0), B)", "(S(0), S(1))"),
    ("(S(0), S(1))", "(S(0), S(0))"),
    ("(B, S(0))", "(B, S(1))"),
    ("(B, P)", "(B, B)"),
    # axis 0 only (axis 1 equal): InterGroupSubTskGphBuilder unless one side is (S(i), S(i))
    ("(P, B)", "(B, B)"),
    ("(P, S(1))", "(B, S(1))"),
    ("(P, S(1))", "(S(0), S(1))"),
    ("(S(0), S(1))", "(B, S(1))"),
    ("(B, S(1))", "(S(0), S(1))"),
    ("(S(1), B)", "(S(0), B)"),
    ("(S(0), P)", "(B, P)"),
    ("(S(0), S(0))", "(B, S(0))"),
    ("(B, S(0))", "(S(0), S(0))"),
    # both axes
    ("(S(0), B)", "(B, S(0))"),
    ("(B, S(0))", "(S(0), B)"),
    ("(P, P)", "(B, B)"),
    ("(S(0), S(1))", "(S(1), S(0))"),
    ("(S(0), S(1))", "(B, B)"),
    ("(P, S(0))", "(S(0), B)"),
    ("(S(0), P)", "(B, B)"),
    ("(B, P)", "(S(0), B)"),
    ("(S(0), S(0))", "(B, B)"),
    ("(S(0), S(0))", "(S(1), S(1))"),
    # P on one axis, the other axis changes (the consumer keeps P)
    ("(P, B)", "(P, S(0))"),
    ("(S(0), P)", "(S(1), P)"),
]


def parse(text: str) -> list:
    out = []
    for part in text[1:-1].split(", "):
        if part == "B":
            out.append(flow.sbp.broadcast)
        elif part == "P":
            out.append(flow.sbp.partial_sum)
        else:
            out.append(flow.sbp.split(int(part[2:-1])))
    return out


def sbp_text(nd) -> str:
    parts = []
    for v in nd.sbp_parallel:
        kind = v.WhichOneof("parallel_type")
        parts.append(
            {"broadcast_parallel": "B", "partial_sum_parallel": "P"}.get(kind)
            or f"S({v.split_parallel.axis})"
        )
    return "(" + ", ".join(parts) + ")"


def main() -> None:
    out = sys.argv[1]
    shape = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "8,16").split(",")]
    hierarchy = [int(s) for s in (sys.argv[3] if len(sys.argv) > 3 else "2,2").split(",")]
    ranks = list(range(hierarchy[0] * hierarchy[1]))
    placement = flow.placement(
        "cpu", ranks=[ranks[i * hierarchy[1] : (i + 1) * hierarchy[1]] for i in range(hierarchy[0])]
    )
    results = []
    # keep every compiled graph alive until the end: destroying one while the next is built
    # aborts OneFlow 0.9 ("runtime_context.cpp:27 Check failed: it != counters_.end()")
    alive = []
    for src, dst in TRANSITIONS:

        class Probe(flow.nn.Graph):
            def __init__(self, src_sbp: list, dst_sbp: list) -> None:
                super().__init__()
                self.src_sbp, self.dst_sbp = src_sbp, dst_sbp

            def build(self, x):
                y = flow._C.identity(x.to_global(placement, self.src_sbp))
                return flow._C.identity(y.to_global(placement, self.dst_sbp))

        x = flow.ones(*shape, placement=placement, sbp=[flow.sbp.broadcast] * 2)
        graph = Probe(parse(src), parse(dst))
        alive.append(graph)
        graph.build_graph(x)
        built = graph._full_job_proto
        # the identity reading src, and the cast to dst that reads it
        src_op = next(
            o.name for o in built.net.op if o.HasField("user_conf") and o.user_conf.op_type_name == "identity"
        )
        record = {"src": src, "dst": dst, "shape": shape, "compiled": False, "middle": [], "error": None}
        try:
            graph.finish_complie_and_init_runtime()
        except Exception as exc:  # recorded: which transitions OneFlow cannot lower
            record["error"] = (
                str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else type(exc).__name__
            )
        else:
            record["compiled"] = True
            job = graph._compiled_job_proto
            conf = job.job_parallel_view_conf.op_name2nd_sbp_signature_conf
            reads = {}
            for o in job.net.op:
                kind = o.WhichOneof("op_type")
                if kind == "identity_conf":
                    reads[o.identity_conf.__getattribute__("in")] = o.name
            lbn = f"{src_op}/out_0"
            while lbn in reads:
                name = reads[lbn]
                record["middle"].append(sbp_text(conf[name].bn_in_op2nd_sbp["out"]))
                lbn = f"{name}/out"
            record["chain"] = [src, *record["middle"], dst]
        results.append(record)
        if flow.env.get_rank() == 0:
            print(
                f"{src} -> {dst}: {'ok' if record['compiled'] else 'FAILED'} "
                f"middle={record['middle']} {record['error'] or ''}",
                flush=True,
            )
    if flow.env.get_rank() == 0:
        with open(out, "w") as fh:
            json.dump(
                {
                    "hierarchy": hierarchy,
                    "device": "cpu",
                    "oneflow": flow.__version__,
                    "transitions": results,
                },
                fh,
                indent=1,
            )


if __name__ == "__main__":
    main()
