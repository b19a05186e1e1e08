"""The hardware a plan runs on: devices, clusters, meshes, links and what they cost.

* :mod:`~autopar.hardware.devices` -- a device's peaks and efficiencies, ``NODESxDEVICES``;
* :mod:`~autopar.hardware.links` -- measured per-collective link costs (a profile's table);
* :mod:`~autopar.hardware.network` -- a node's network cards and the bus bandwidth NCCL gets
  from them for a group that spans nodes (pure functions);
* :mod:`~autopar.hardware.cluster` -- cluster profiles, the presets (``profiles/*.json``) and
  :class:`~autopar.hardware.cluster.Cluster`;
* :mod:`~autopar.hardware.mesh` -- the logical mesh laid over a cluster and each axis's link;
* :mod:`~autopar.hardware.collectives` -- the time of one collective on one mesh axis;
* :mod:`~autopar.hardware.kernels` -- the time of a GEMM or a memory-bound kernel on one device;
* :mod:`~autopar.hardware.nccl_tests`, :mod:`~autopar.hardware.kernel_timings`,
  :mod:`~autopar.hardware.network_calibration`, :mod:`~autopar.hardware.calibrate` -- a profile
  fitted from nccl-tests logs (per mesh axis and over whole nodes) and GEMM timings;
* :mod:`~autopar.hardware.json_fields` -- the checks a profile's JSON objects share.

Imports: :mod:`autopar.errors`, :mod:`autopar.infra`.  Nothing here knows SBP or graphs.
"""
