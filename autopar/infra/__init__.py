"""What planning runs on, with no knowledge of training: the clock and progress of one command
(:mod:`~autopar.infra.progress`), key-value stores (:mod:`~autopar.infra.store`), worker
processes that can be stopped (:mod:`~autopar.infra.batch_pool`) and a paused garbage
collector (:mod:`~autopar.infra.collector`).

Imports: :mod:`autopar.errors` only (the bottom of the core).
"""
