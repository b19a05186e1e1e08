"""The baselines: named models of other systems, priced as those systems run.

* :mod:`~autopar.baselines.problem` -- what every baseline strategy reads, and the strategy type;
* :mod:`~autopar.baselines.greedy_walk` -- the topological walk under Megatron's discipline;
* :mod:`~autopar.baselines.megatron` -- Megatron-LM: its layout
  (:mod:`~autopar.baselines.megatron.layout`) and its PTD-P pipeline
  (:mod:`~autopar.baselines.megatron.pipeline`);
* :mod:`~autopar.baselines.data_parallel`, :mod:`~autopar.baselines.single_device`;
* :mod:`~autopar.baselines.oneflow_inference` -- LiBai's layout under OneFlow 0.9's greedy SBP
  inference (``inferred``);
* :mod:`~autopar.baselines.plans` -- a baseline's plan by kind;
* :mod:`~autopar.baselines.configs` -- the configurations each system's users run, the best;
* :mod:`~autopar.baselines.pricing` -- one configuration priced (one mesh, or a pipeline).

Imports: :mod:`autopar.pipeline` and below.
"""
