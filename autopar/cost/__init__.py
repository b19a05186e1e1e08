"""The cost model: what a plan costs in time and memory, per op, per edge and per iteration.

* :mod:`~autopar.cost.compute` -- an op's signatures and compute seconds under each;
* :mod:`~autopar.cost.zero_gathers` -- ZeRO's parameter gathers after the update;
* :mod:`~autopar.cost.edges` -- what kind an edge is and its boxing seconds;
* :mod:`~autopar.cost.memory` -- model states under ZeRO and the activation peak;
* :mod:`~autopar.cost.iteration`, :mod:`~autopar.cost.activation_spans`,
  :mod:`~autopar.cost.weighted_tables` -- the iteration: K micro-batches, once-per-step work,
  recomputation, and the tables weighted by how often each op runs;
* :mod:`~autopar.cost.table_keys`, :mod:`~autopar.cost.tables`,
  :mod:`~autopar.cost.build_tables`, :mod:`~autopar.cost.remote_tables` -- the cost tables of a
  graph on a mesh, their content keys, and their entries built in processes or on workers;
* :mod:`~autopar.cost.evaluation`, :mod:`~autopar.cost.evaluate` -- the independent
  re-evaluation of a plan;
* :mod:`~autopar.cost.breakdown` -- where a plan's time and memory go;
* :mod:`~autopar.cost.model_version` -- the cost model's version in every table key.

Imports: everything below it (:mod:`autopar.infra`, :mod:`autopar.hardware`, :mod:`autopar.ir`,
:mod:`autopar.runtimes`, :mod:`autopar.rules`).
"""
