"""What the importer strips from a compiled OneFlow job to get one training step: the
iteration's rewrites (gradient accumulation, recomputation copies), ZeRO's casts, identities
in front of parameters, the optimizer's extra ports and state, constant subgraphs.
"""

from __future__ import annotations

from collections import defaultdict, deque

from autopar.bridges.oneflow.iteration import (
    ACCUMULATION_OP_TYPES,
    FAKE_FORWARD_PREFIXES,
    is_recompute_op,
    original_name,
)
from autopar.bridges.oneflow.job_ops import _DIFF_SCALE_PREFIX, _ZERO_CAST_PREFIX, _descendants, _Import

__all__ = ["OPTIMIZER_MODEL_PORTS"]

OPTIMIZER_MODEL_PORTS = ("model_0", "model_diff_0")
"""Ports of an optimizer update op that the import keeps (parameter and gradient)."""


# ---------------------------------------------------------------- classify


def _strip_iteration(imp: _Import) -> None:
    """0. The iteration: the graph is the graph of one micro-batch.

    Gradient accumulation's ops: consumers of a ``repeat`` (after a variable) or an ``acc``
    (on a gradient) read its input; a source reading a repeated tick loses that port; an
    input's ``unpack`` and an output's ``pack`` go, the input and output taking one
    micro-batch's shape; so does each accumulated gradient's ``1/K`` scaling
    (``Sys-DiffScale-ScalarMul``).  Checkpointing's recompute copies
    (:data:`autopar.bridges.oneflow.iteration.FAKE_FORWARD_PREFIXES`) and the boxing identities of
    their outputs: the backward reads the forward op's own output.  ``K`` and the
    recomputed blocks are in ``meta["training"]``
    (:func:`autopar.bridges.oneflow.iteration.job_training`)."""
    recompute: list[str] = []
    accumulation: list[str] = []
    ticks: set[str] = set()
    packed: dict[str, str] = {}
    for r in imp.kept:
        if is_recompute_op(r.name) and not original_name(r.name).startswith(_ZERO_CAST_PREFIX):
            for out in r.outputs.values():
                for prefix in FAKE_FORWARD_PREFIXES:
                    if out.startswith(prefix):
                        imp.rename[out] = out[len(prefix) :]
            recompute.append(r.name)
        elif (
            not is_recompute_op(r.name)
            and any(f in r.name for f in FAKE_FORWARD_PREFIXES)
            and len(r.inputs) == len(r.outputs) == 1
        ):
            # OneFlow's boxing identity (Sys-Boxing-GroupIdentity-...) of a recompute copy
            imp.rename[next(iter(r.outputs.values()))] = next(iter(r.inputs.values()))
            recompute.append(r.name)
        elif r.kind == "user_conf" and r.type in ACCUMULATION_OP_TYPES and len(r.inputs) == 1:
            (src,) = r.inputs.values()
            (out,) = r.outputs.values()
            if r.type == "repeat" and imp.by_name[imp.producer[src]].kind != "variable_conf":
                ticks.add(out)  # a source's repeated tick: a port the source did not have
            imp.rename[out] = src
            if r.type == "unpack":
                imp.shape_of[src] = out
            if r.type == "pack":
                packed[out] = src
            accumulation.append(r.name)
    if accumulation:  # the 1/K scaling of each accumulated gradient: none with one micro-batch
        for r in imp.kept:
            if r.name.startswith(_DIFF_SCALE_PREFIX) and r.type == "scalar_mul" and len(r.inputs) == 1:
                imp.rename[next(iter(r.outputs.values()))] = next(iter(r.inputs.values()))
                accumulation.append(r.name)
    gone = {*recompute, *accumulation}
    if not gone:
        return
    for reason, names in (("recompute", recompute), ("accumulation", accumulation)):
        if names:
            imp.dropped[reason] = names
    imp.kept = [r for r in imp.kept if r.name not in gone]
    for r in imp.kept:
        r.inputs = {p: t for p, t in r.inputs.items() if t not in ticks}
        if any(t in packed for t in r.inputs.values()) and len(r.inputs) == len(r.outputs) == 1:
            # an output of K packed values: the one micro-batch's value
            imp.shape_of[next(iter(r.outputs.values()))] = packed[next(iter(r.inputs.values()))]
    for blob in list(imp.rename):  # a boxing identity reads a copy, which reads the original
        target = imp.rename[blob]
        while target in imp.rename and imp.rename[target] != target:
            target = imp.rename[target]
        imp.rename[blob] = target
    imp.read_through(imp.rename)
    for r in imp.kept:
        if r.kind == "input_conf" and "shape" in r.attrs:
            micro = imp.shape_of.get(next(iter(r.outputs.values()), ""))
            if micro is not None:
                r.attrs["shape"] = [int(d) for d in imp.blob_desc[micro].shape.dim]


def _drop_zero_casts(imp: _Import) -> None:
    """1. ZeRO parallel casts: consumers read the variable itself."""
    for r in imp.kept:
        name = original_name(r.name)  # a recompute copy of a cast (checkpointing) is one too
        if name.startswith(_ZERO_CAST_PREFIX) and r.type in ("hierarchical_parallel_cast", "parallel_cast"):
            (src,) = r.inputs.values()
            for out in r.outputs.values():
                imp.rename[out] = src
            if name == r.name or imp.producer.get(src, src) not in imp.zero_layouts:
                imp.zero_layouts[imp.producer.get(src, src)] = list(r.attrs.get("nd_sbp") or [])
            imp.dropped["zero_cast"].append(r.name)
    imp.kept = [r for r in imp.kept if r.name not in set(imp.dropped["zero_cast"])]
    imp.read_through(imp.rename)


def _bypass_parameter_identities(imp: _Import) -> None:
    """1b. Identities that only re-read a parameter (what a model does so that OneFlow
    boxes a copy, not the variable's own buffer): consumers read the parameter."""
    variable_of = {  # blob -> the parameter it re-reads (a chain of identities included)
        lbn: lbn
        for r in imp.kept
        if r.kind == "variable_conf" and not r.name.startswith("System-")
        for lbn in r.outputs.values()
    }
    changed = True
    while changed:  # a compiled job may put a boxing identity between two (any op order)
        changed = False
        for r in imp.kept:
            if r.type in ("identity", "amp_white_identity") and len(r.inputs) == 1 and len(r.outputs) == 1:
                (src,) = r.inputs.values()
                (out,) = r.outputs.values()
                if src in variable_of and out not in variable_of:
                    variable_of[out] = imp.rename[out] = variable_of[src]
                    imp.dropped["parameter_identity"].append(r.name)
                    changed = True
    if imp.dropped["parameter_identity"]:
        gone = set(imp.dropped["parameter_identity"])
        imp.kept = [r for r in imp.kept if r.name not in gone]
        imp.read_through(imp.rename)


def _strip_optimizer_ports(imp: _Import) -> dict[str, int]:
    """2. Optimizer update ops keep only the parameter and its gradient.  Returns the
    variables that fed a dropped port (optimizer state, if nothing else reads them)."""
    imp.update_ops = {
        r.name
        for r in imp.kept
        if r.kind == "user_conf" and all(p in r.inputs for p in OPTIMIZER_MODEL_PORTS)
    }
    state_candidates: dict[str, int] = defaultdict(int)
    for upd in imp.update_ops:
        r = imp.by_name[upd]
        extra = [p for p in r.inputs if p not in OPTIMIZER_MODEL_PORTS]
        for p in extra:
            state = imp.producer.get(r.inputs[p])
            if (
                state is not None
                and imp.by_name[state].kind == "variable_conf"
                and state not in imp.trainable
            ):
                state_candidates[state] += 1
        if extra:
            imp.dropped_ports[upd] = extra
            r.inputs = {p: t for p, t in r.inputs.items() if p in OPTIMIZER_MODEL_PORTS}
    return state_candidates


def _drop_optimizer_state(imp: _Import, state_candidates: dict[str, int]) -> dict[str, list[str]]:
    """3. Optimizer state variables: read by nothing once those ports are gone.  Returns
    op -> the kept ops that read it (before dropping them)."""
    consumers_of: dict[str, list[str]] = defaultdict(list)
    for r in imp.kept:
        for t in r.inputs.values():
            maker = imp.producer.get(t)
            if maker is not None:
                consumers_of[maker].append(r.name)
    for var in state_candidates:
        if not consumers_of.get(var):
            imp.dropped["optimizer_state"].append(var)
    imp.kept = [r for r in imp.kept if r.name not in set(imp.dropped["optimizer_state"])]
    return consumers_of


def _fold_constants(imp: _Import, consumers_of: dict[str, list[str]]) -> None:
    """4. Ops with no data dependence on the model or the data: those a kept op reads
    become inputless ``constant`` ops (same name and outputs); the rest are dropped."""
    producer = imp.producer
    sources = [
        r.name
        for r in imp.kept
        if r.kind == "input_conf" or (r.kind == "variable_conf" and not r.name.startswith("System-"))
    ]
    dependent = _descendants(sources, consumers_of)
    kept_names = {r.name for r in imp.kept}
    frontier: set[str] = set()
    for r in imp.kept:
        if r.name in dependent:
            for t in r.inputs.values():
                maker = producer.get(t)
                if maker is not None and maker in kept_names and maker not in dependent:
                    frontier.add(maker)
    folded_into: set[str] = set()
    for r in imp.kept:
        if r.name in frontier and r.inputs:
            queue = deque(producer[t] for t in r.inputs.values() if t in producer)
            while queue:
                up = queue.popleft()
                if up not in folded_into:
                    folded_into.add(up)
                    queue.extend(producer[t] for t in imp.by_name[up].inputs.values() if t in producer)
            r.attrs = {"folded_type": r.type}
            r.type = "constant"
            r.inputs = {}
            imp.folded.append(r.name)
    keep = dependent | frontier
    for r in imp.kept:
        if r.name not in keep:
            imp.dropped["constant_input" if r.name in folded_into else "system"].append(r.name)
    imp.kept = [r for r in imp.kept if r.name in keep]
