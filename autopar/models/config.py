"""Shared configuration pieces of the model builders: the optimizer and validation helpers.

Each model family has its own frozen config dataclass (``T5Config``,
``GPTConfig``, ``BertConfig``) whose ``__post_init__`` raises
:class:`~autopar.errors.ConfigError` (code ``bad_model_config``) naming the
field, the value and what to do.  :class:`TransformerLMConfig` holds the checks
and derived sizes that ``GPTConfig`` and ``BertConfig`` share.
:func:`apply_overrides` turns the keyword overrides of
:func:`autopar.models.build` into a new config.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

from autopar.errors import ConfigError
from autopar.models.style import LayerStyle

__all__ = [
    "COMPUTE_DTYPES",
    "FamilyConfig",
    "OptimizerConfig",
    "PaddedVocab",
    "TransformerLMConfig",
    "apply_overrides",
    "check_divisible",
    "check_dtype",
    "check_max_position",
    "check_positive_int",
    "check_rate",
    "check_sizes",
    "padded_vocab",
]

COMPUTE_DTYPES = ("float16", "bfloat16", "float32")


def _bad(model: str, field: str, message: str, value: Any) -> ConfigError:
    return ConfigError("bad_model_config", f"{model}: {field} {message}", field=field, value=repr(value))


def check_positive_int(model: str, field: str, value: Any) -> None:
    """``value`` must be an int >= 1 (bools are refused)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _bad(model, field, f"must be a positive integer, got {value!r}", value)


def check_sizes(config: Any, required: Iterable[str], optional: Iterable[str] = ()) -> None:
    """Each ``required`` field of ``config`` is a positive int, each ``optional`` one too unless None."""
    for f in required:
        check_positive_int(config.name, f, getattr(config, f))
    for f in optional:
        if getattr(config, f) is not None:
            check_positive_int(config.name, f, getattr(config, f))


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


def check_max_position(model: str, what: str, length: int, max_position: int, hint: str) -> None:
    """A sequence of ``length`` (described by ``what``) must fit the position embedding."""
    if length > max_position:
        raise ConfigError(
            "bad_model_config",
            f"{model}: {what} exceeds max_position ({max_position}); pass max_position={length} or {hint}",
            field="max_position",
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


class FamilyConfig(Protocol):
    """What every family's config dataclass offers the shared code."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    @property
    def name(self) -> str: ...

    @property
    def optimizer(self) -> OptimizerConfig: ...

    @property
    def padded_vocab(self) -> int: ...


class PaddedVocab:
    """Mixin of every family's config: ``padded_vocab``, the embedding rows."""

    vocab: int
    make_vocab_size_divisible_by: int

    @property
    def padded_vocab(self) -> int:
        return padded_vocab(self.vocab, self.make_vocab_size_divisible_by)


class TransformerLMConfig(PaddedVocab):
    """Checks and derived sizes shared by ``GPTConfig`` and ``BertConfig``.

    A mixin: each of those frozen dataclasses declares the fields (with its own
    defaults, in its own order) and inherits ``__post_init__`` and the properties.
    """

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]
    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int | None
    max_position: int | None
    batch: int
    seq: int
    dropout: float
    layer_norm_epsilon: float
    dtype: str
    optimizer: OptimizerConfig

    _SIZES: ClassVar[tuple[str, ...]] = (
        "layers",
        "hidden",
        "heads",
        "vocab",
        "make_vocab_size_divisible_by",
        "type_vocab",
        "batch",
        "seq",
    )
    """Fields that must be positive ints (those a family has, in its field order)."""

    def __post_init__(self) -> None:
        sizes = [f.name for f in dataclasses.fields(self) if f.name in self._SIZES]
        check_sizes(self, sizes, optional=("ffn", "max_position"))
        check_divisible(self.name, "hidden", self.hidden, self.heads, "change hidden or heads")
        check_rate(self.name, "dropout", self.dropout)
        check_dtype(self.name, self.dtype)
        if self.max_position is not None:
            check_max_position(self.name, f"seq ({self.seq})", self.seq, self.max_position, "a shorter seq")

    @property
    def ffn_dim(self) -> int:
        return self.ffn if self.ffn is not None else 4 * self.hidden

    @property
    def positions(self) -> int:
        return self.max_position if self.max_position is not None else self.seq

    def style_of_layers(self) -> LayerStyle:
        return LayerStyle.create(
            hf_t5=False,
            heads=self.heads,
            head_dim=self.hidden // self.heads,
            ffn=self.ffn_dim,
            norm_epsilon=self.layer_norm_epsilon,
            dropout=self.dropout,
            weight_decay=self.optimizer.weight_decay,
        )


C = TypeVar("C", bound=FamilyConfig)


def apply_overrides(config: C, overrides: Mapping[str, Any], aliases: Mapping[str, tuple[str, ...]]) -> C:
    """A copy of ``config`` with ``overrides`` applied.

    Keys are the config's own fields, the optimizer's fields (``lr``,
    ``weight_decay``, ``clip_grad_max_norm`` ...) or an alias expanding to
    several fields (``layers`` -> ``encoder_layers`` and ``decoder_layers`` for
    T5).  Explicit fields win over aliases.  Unknown keys raise ConfigError
    (code ``unknown_override``) listing the valid ones.
    """
    own = {f.name for f in dataclasses.fields(config)} - {"name", "optimizer"}
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
    return dataclasses.replace(config, **direct)
