"""Op rules: valid N-D SBP signatures and work per op family (see :mod:`autopar.rules.registry`)."""

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
