"""Megatron-LM (Megatron-Core) as a runtime: its profile
(:mod:`~autopar.runtimes.megatron_lm.runtime`), boxing within fixed process groups
(:mod:`~autopar.runtimes.megatron_lm.boxing`), and its tensor-parallel linears as they appear
in a graph (:mod:`~autopar.runtimes.megatron_lm.linears`), which the runtime fuses and the
``megatron`` baseline lays out.
"""
