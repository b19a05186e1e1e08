"""Imported by the forkserver (:data:`autopar_service.work_pool.FORKSERVER_PRELOAD`) to warm what
every worker process would otherwise compute on its first request: the content hashes of the
bundled models (:func:`autopar_service.graphs.bundled_model_of`, 0.8 s), which a fork inherits.

Nothing else imports this module: its import does that work.
"""

from __future__ import annotations

from autopar_service.graphs import bundled_model_of

bundled_model_of("")
