"""Numeric solver: one choice (SBP signature) per node, minimum modelled step time,
hard per-device memory rows.

::

    problem     Problem / MemoryRow / Solution, evaluate()      numpy only
    options     SolverOptions, Progress                          no numpy
    reductions  exact reductions with an undo stack              numpy, numba
    dominance   dominated choices of a node (compiled)           numba
    heuristic   greedy, Lagrangian memory pricing, tree-block descent   numpy only
    bounds      TRW-S lower bound (resumable, priced), decoding  numpy, numba
    trws_kernels  compiled sweeps, bound, decoding and ICM       numba
    synthetic   training-step-shaped random problems             numpy only
    cpsat       CP-SAT model, min_feasible_memory, find_feasible        OR-Tools
    lns         CP-SAT on windows of problems too big for one model     OR-Tools
    solve       reduce -> heuristic -> dual (bound + decoded plans) ->
                CP-SAT (one model or windows) -> expand -> verify       OR-Tools
    planner     graph + cost tables -> Problem -> verified Plan (lead)

Nothing is imported here, so ``autopar_solver.problem`` and the numpy-only modules load
beside OneFlow 0.9 (numpy 1.x, no OR-Tools).
"""
