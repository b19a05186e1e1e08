"""The intermediate representation: what a request and a plan are made of.

* :mod:`~autopar.ir.sbp` -- ``S(d)``, ``B``, ``P``, N-D SBPs and signatures;
* :mod:`~autopar.ir.graph` -- the op graph of one training step (``autopar.graph/v1``);
* :mod:`~autopar.ir.ports`, :mod:`~autopar.ir.optimizer` -- port names, optimizer update ops;
* :mod:`~autopar.ir.structure` -- what a graph's structure says (parameter sources,
  weight-gradient paths, linears that read one activation);
* :mod:`~autopar.ir.training` -- the iteration a job asks for (K micro-batches, checkpointing);
* :mod:`~autopar.ir.plan` -- placement plans (``autopar.plan/v1``);
* :mod:`~autopar.ir.wire` -- the pydantic models of both wire formats;
* :mod:`~autopar.ir.content_key` -- content addressing of requests and code.

Imports: :mod:`autopar.errors`, :mod:`autopar.infra`, :mod:`autopar.hardware` (a plan names its
mesh).  Nothing here prices anything.
"""
