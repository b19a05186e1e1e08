"""The runtimes a plan is priced for: one named object per framework, and how each lowers boxing.

A runtime answers what the cost model asks of the framework that runs a plan: how an N-D SBP
change becomes collectives, over which axes ZeRO shards a replicated parameter, how gradients
are bucketed, whether their reduction overlaps backward, whether sibling linears run as one GEMM.

* :mod:`~autopar.runtimes.profile` -- :class:`~autopar.runtimes.profile.RuntimeProfile`, the
  record every runtime is, and the ZeRO sharding rules;
* :mod:`~autopar.runtimes.ideal` -- ``ideal``: the cheapest sequence of 1-D ring collectives;
* :mod:`~autopar.runtimes.oneflow_09` -- ``oneflow-0.9`` (the default): OneFlow 0.9's boxing
  lowering, its hop tables and copy costs;
* :mod:`~autopar.runtimes.megatron_lm` -- ``megatron-lm``: boxing within fixed process groups,
  and Megatron's linears recognised in a graph;
* :mod:`~autopar.runtimes.boxing` -- what every lowering produces (steps of 1-D collectives);
* :mod:`~autopar.runtimes.registry` -- the runtimes by name, boxing priced by a runtime.

Imports: :mod:`autopar.errors`, :mod:`autopar.hardware`, :mod:`autopar.ir`.
"""
