"""Pipeline parallelism: a graph's blocks cut into stages on sub-meshes, priced under 1F1B.

* :mod:`~autopar.pipeline.split` -- the cut: contiguous block ranges, each stage's graph;
* :mod:`~autopar.pipeline.schedule` -- the 1F1B schedule's iteration and micro-batches in flight;
* :mod:`~autopar.pipeline.plan` -- pipeline plans (``autopar.pipeline/v1``);
* :mod:`~autopar.pipeline.evaluate` -- a pipeline plan re-checked and priced stage by stage.

Imports: :mod:`autopar.cost` and below.  Which cut to choose is the solver's
(``autopar_solver.planner.stage_search``).
"""
