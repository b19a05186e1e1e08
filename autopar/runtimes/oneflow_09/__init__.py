"""OneFlow 0.9 as a runtime (``oneflow-0.9``, the default): its profile
(:mod:`~autopar.runtimes.oneflow_09.runtime`), how it lowers one boxing hop
(:mod:`~autopar.runtimes.oneflow_09.lowering`), its route through middle SBPs
(:mod:`~autopar.runtimes.oneflow_09.pricing`, :mod:`~autopar.runtimes.oneflow_09.copy_cost`),
every hop of a mesh priced at once (:mod:`~autopar.runtimes.oneflow_09.hop_table`) and the
boxing finder built on them (:mod:`~autopar.runtimes.oneflow_09.boxing`).  Pure Python: nothing
here imports OneFlow (the bridge that does is :mod:`autopar.bridges.oneflow`).
"""
