"""Op rules: valid N-D SBP signatures and work per op family (see :mod:`autopar.rules.registry`).

Importing this package (which importing any of its modules does first) imports
:mod:`autopar.rules.families`, whose modules register their rules in the set
:func:`default_rules` returns.  The registry itself never imports the families,
so the modules form no import cycle.
"""

from autopar.rules import check, families  # noqa: F401  (registers the default rules and the graph check)
from autopar.rules.registry import (
    CostKind,
    Rule,
    RuleContext,
    RuleSet,
    default_rules,
    fallback_signatures,
    nd_signatures,
    register,
    work_share,
)

__all__ = [
    "CostKind",
    "Rule",
    "RuleContext",
    "RuleSet",
    "default_rules",
    "fallback_signatures",
    "nd_signatures",
    "register",
    "work_share",
]
