"""The ``autopar`` command line: the composition root of the core's commands.

* :mod:`~autopar.cli.main` -- the parser and ``model``, ``costs``, ``baseline``, ``evaluate``;
* :mod:`~autopar.cli.args` -- what every subcommand shares (:class:`~autopar.cli.args.Command`,
  memory sizes, mesh and graph arguments);
* :mod:`~autopar.cli.calibrate` -- ``autopar calibrate``;
* :mod:`~autopar.cli.oneflow` -- ``autopar oneflow ...``.

Commands of the outer packages (``plan``, ``serve``, ``report``, ...) are entry points
(``autopar.commands``), so the core imports none of them.  Imports: the whole core.
"""
