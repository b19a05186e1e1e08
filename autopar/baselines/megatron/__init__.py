"""Megatron-LM as a baseline: its tensor-parallel layout on a graph
(:mod:`~autopar.baselines.megatron.layout`) and its PTD-P pipeline
(:mod:`~autopar.baselines.megatron.pipeline`), priced under the ``megatron-lm`` runtime.
"""
