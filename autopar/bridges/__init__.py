"""Bridges to the frameworks that run plans.  :mod:`autopar.bridges.oneflow` is the only code
in the core that imports ``oneflow`` (inside functions, so it imports without OneFlow).

Imports: anything in the core below :mod:`autopar.cli`.
"""
