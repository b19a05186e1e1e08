"""Shared configuration pieces of the model builders: the optimizer and validation helpers.

Each model family has its own frozen config dataclass (``T5Config``,
``GPTConfig``, ``BertConfig``) whose ``__post_init__`` raises
:class:`~autopar.errors.ConfigError` (code ``bad_model_config``) naming the
field, the value and what to do.  :func:`apply_overrides` turns the keyword
overrides of :func:`autopar.models.build` into a new config.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from autopar.errors import ConfigError

__all__ = [
    "COMPUTE_DTYPES",
    "OptimizerConfig",
    "apply_overrides",
    "check_divisible",
    "check_dtype",
    "check_positive_int",
    "check_rate",
    "padded_vocab",
]

COMPUTE_DTYPES = ("float16", "bfloat16", "float32")


def _bad(model: str, field: str, message: str, value: Any) -> ConfigError:
    return ConfigError("bad_model_config", f"{model}: {field} {message}", field=field, value=repr(value))


def check_positive_int(model: str, field: str, value: Any) -> None:
    """``value`` must be an int >= 1 (bools are refused)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _bad(model, field, f"must be a positive integer, got {value!r}", value)


def check_rate(model: str, field: str, value: Any) -> None:
    """A dropout rate in [0, 1)."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0.0 <= value < 1.0:
        raise _bad(model, field, f"must be a probability in [0, 1), got {value!r}", value)


def check_dtype(model: str, value: Any) -> None:
    """The compute (activation) dtype."""
    if value not in COMPUTE_DTYPES:
        raise _bad(model, "dtype", f"must be one of {list(COMPUTE_DTYPES)}, got {value!r}", value)


def check_divisible(model: str, what: str, numerator: int, denominator: int, hint: str) -> None:
    """``numerator`` must be a multiple of ``denominator``."""
    if numerator % denominator:
        raise ConfigError(
            "bad_model_config",
            f"{model}: {what} ({numerator}) is not divisible by {denominator}; {hint}",
            field=what,
        )


def padded_vocab(vocab: int, multiple: int) -> int:
    """Megatron's ``make_vocab_size_divisible_by``: round ``vocab`` up to a multiple.

    50257 (GPT-2) with multiple 128 -> 50304.  Units: rows of the embedding table.
    Source: Megatron-LM ``_vocab_size_with_padding``.
    """
    return int(math.ceil(vocab / multiple) * multiple)


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW as OneFlow runs it (``adam_update``), with LiBai's default hyper-parameters.

    Weight decay applies to weights and embeddings; biases and norm weights get 0
    (LiBai's ``get_default_optimizer_params``).  ``clip_grad_max_norm`` adds
    OneFlow's clip-by-global-norm ops (``None`` disables them).
    """

    lr: float = 1e-4
    """Learning rate (``learning_rate_val``)."""
    beta1: float = 0.9
    """First-moment decay."""
    beta2: float = 0.999
    """Second-moment decay."""
    epsilon: float = 1e-8
    """Adam epsilon."""
    weight_decay: float = 0.01
    """Decoupled weight decay of weights and embeddings."""
    clip_grad_max_norm: float | None = 1.0
    """Global gradient-norm clip (LiBai default 1.0); None: no clipping ops."""
    clip_grad_norm_type: float = 2.0
    """The p of the p-norm used for clipping."""

    def __post_init__(self) -> None:
        name = "optimizer"
        for field, value, ok, rule in (
            ("lr", self.lr, lambda v: v > 0, "must be > 0"),
            ("beta1", self.beta1, lambda v: 0 <= v < 1, "must be in [0, 1)"),
            ("beta2", self.beta2, lambda v: 0 <= v < 1, "must be in [0, 1)"),
            ("epsilon", self.epsilon, lambda v: v > 0, "must be > 0"),
            ("weight_decay", self.weight_decay, lambda v: v >= 0, "must be >= 0"),
            ("clip_grad_norm_type", self.clip_grad_norm_type, lambda v: v > 0, "must be > 0"),
        ):
            if not isinstance(value, int | float) or isinstance(value, bool) or not ok(value):
                raise _bad(name, field, f"{rule}, got {value!r}", value)
        clip = self.clip_grad_max_norm
        if clip is not None and (not isinstance(clip, int | float) or isinstance(clip, bool) or clip <= 0):
            raise _bad(name, "clip_grad_max_norm", f"must be > 0 or None, got {clip!r}", clip)


class _ModelConfig(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def optimizer(self) -> OptimizerConfig: ...


C = TypeVar("C", bound=_ModelConfig)


def apply_overrides(config: C, overrides: Mapping[str, Any], aliases: Mapping[str, tuple[str, ...]]) -> C:
    """A copy of ``config`` with ``overrides`` applied.

    Keys are the config's own fields, the optimizer's fields (``lr``,
    ``weight_decay``, ``clip_grad_max_norm`` ...) or an alias expanding to
    several fields (``layers`` -> ``encoder_layers`` and ``decoder_layers`` for
    T5).  Explicit fields win over aliases.  Unknown keys raise ConfigError
    (code ``unknown_override``) listing the valid ones.
    """
    own = {f.name for f in dataclasses.fields(config)} - {"name", "optimizer"}  # type: ignore[arg-type]
    optimizer_fields = {f.name for f in dataclasses.fields(OptimizerConfig)}
    direct: dict[str, Any] = {}
    optimizer: dict[str, Any] = {}
    for key, value in overrides.items():
        if key in aliases:
            for target in aliases[key]:
                direct.setdefault(target, value)
    for key, value in overrides.items():
        if key in aliases:
            continue
        if key in own:
            direct[key] = value
        elif key in optimizer_fields:
            optimizer[key] = value
        else:
            valid = sorted(own | optimizer_fields | set(aliases))
            raise ConfigError(
                "unknown_override",
                f"{config.name}: unknown override {key!r}; valid overrides are {valid}",
                override=key,
            )
    if optimizer:
        direct["optimizer"] = dataclasses.replace(config.optimizer, **optimizer)
    return dataclasses.replace(config, **direct)  # type: ignore[type-var]
