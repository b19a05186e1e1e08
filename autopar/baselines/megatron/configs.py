"""Megatron-LM's configuration space, as its users name it and as they would search it.

A configuration is ``tp, pp, dp`` (tensor parallelism inside a node, pipeline stages across
nodes, data parallelism for the rest: Narayanan et al. 2021, "PTD-P"), and the options
Megatron-Core users turn on today (Korthikanti et al. 2022; megatron/training/arguments.py):

============  ===============================================  ===================================
key           values                                           Megatron-LM
============  ===============================================  ===================================
``tp``        a divisor of the devices per node                ``--tensor-model-parallel-size``
``pp``        a divisor of the nodes (and of the layers)       ``--pipeline-model-parallel-size``
``dp``        ``devices / (tp pp)``, dividing the batch        (the rest)
``vpp``       model chunks per device, dividing ``L / pp``     ``--num-layers-per-virtual-
                                                               pipeline-stage L/(pp vpp)``
``sp``        ``on`` / ``off`` (``on`` needs ``tp > 1``)        ``--sequence-parallel``
``recompute`` ``none``, ``selective``, ``selective:M+M``,       ``--recompute-activations``;
              ``full``, ``full:N``                             ``--recompute-granularity
                                                               selective --recompute-modules M
                                                               M`` (``core_attn``,
                                                               ``layernorm``);
                                                               ``--recompute-granularity full
                                                               --recompute-method uniform|block
                                                               --recompute-num-layers N``
``optimizer`` ``ddp`` / ``distributed`` / ``fsdp``             ``--use-distributed-optimizer``;
                                                               ``--use-megatron-fsdp`` (ZeRO-3,
                                                               ``pp = 1``)
============  ===============================================  ===================================

Gradients are reduced with ``--overlap-grad-reduce`` and parameters gathered with
``--overlap-param-gather`` (the ``megatron-lm`` runtime, :mod:`autopar.runtimes.megatron_lm`).
A user names what they run with :func:`parse_megatron_config`; the keys they leave out are
searched (:func:`megatron_structures`, then :mod:`autopar.baselines.search` for the
recomputation).
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.baselines.configs import MEGATRON_OPTIMIZERS, MEGATRON_RUNTIME, BaselineConfig
from autopar.errors import ConfigError
from autopar.hardware.cluster import Cluster
from autopar.pipeline.schedule import interleaving_refusal

__all__ = [
    "MEGATRON_KEYS",
    "VIRTUAL_STAGES",
    "MegatronChoice",
    "megatron_config",
    "megatron_structures",
    "parse_megatron_config",
    "recompute_blocks",
    "selective_groups",
]

MEGATRON_KEYS = ("tp", "pp", "dp", "vpp", "sp", "recompute", "optimizer")
"""What ``--megatron-config`` takes (every key optional; the others are searched)."""
VIRTUAL_STAGES = (1, 2, 4, 8)
"""Model chunks per device the search tries (where Megatron-LM accepts them)."""
_OPTIMIZER_NAMES = {"ddp": 0, "distributed": 1, "distributed-optimizer": 1, "fsdp": 3}
_SWITCH = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}


@dataclass(frozen=True)
class MegatronChoice:
    """The part of a Megatron-LM configuration a user names; None: searched."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    vpp: int | None = None
    sp: bool | None = None
    recompute: str | None = None
    zero_stage: int | None = None
    """0: DDP; 1: the distributed optimizer; 3: Megatron-FSDP."""

    @property
    def named(self) -> bool:
        return any(v is not None for v in vars(self).values())


def parse_megatron_config(text: str, cluster: Cluster) -> MegatronChoice:
    """``tp=8,pp=8,dp=1,vpp=2,sp=on,recompute=selective,optimizer=distributed`` (any subset;
    :data:`MEGATRON_KEYS`) -> the choice, checked against ``cluster``.  Raises
    :class:`ConfigError` (code ``bad_baseline_config``) naming what is wrong."""
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        key = key.strip().lower()
        if not sep or not key or key in fields:
            raise ConfigError(
                "bad_baseline_config",
                f"bad megatron configuration {text!r}: write key=value pairs separated by commas, "
                f"keys {', '.join(MEGATRON_KEYS)}",
            )
        fields[key] = value.strip().lower()
    unknown = sorted(set(fields) - set(MEGATRON_KEYS))
    if unknown:
        raise ConfigError(
            "bad_baseline_config",
            f"bad megatron configuration {text!r}: unknown {', '.join(unknown)}; keys are "
            + ", ".join(MEGATRON_KEYS),
        )
    choice = MegatronChoice(
        tp=_positive(fields, "tp", text),
        pp=_positive(fields, "pp", text),
        dp=_positive(fields, "dp", text),
        vpp=_positive(fields, "vpp", text),
        sp=_switch(fields, text),
        recompute=_recompute(fields.get("recompute"), text),
        zero_stage=_optimizer(fields.get("optimizer"), text),
    )
    _check_choice(choice, cluster, text)
    return choice


def megatron_config(text: str, cluster: Cluster) -> BaselineConfig:
    """The configuration ``text`` names, with Megatron-LM's own defaults for the keys it leaves
    out (``tp=1``, ``pp=1``, no interleaving, ``sp=off``, ``recompute=none``, DDP; ``dp`` the
    rest of the devices): the one run a user describes, nothing searched."""
    c = parse_megatron_config(text, cluster)
    tp, pp = c.tp or 1, c.pp or 1
    dp = cluster.world_size // (tp * pp)
    if c.dp is not None and c.dp != dp:
        raise ConfigError(
            "bad_baseline_config",
            f"tp({tp}) * dp({c.dp}) * pp({pp}) != devices({cluster.world_size}) of cluster {cluster}",
        )
    return BaselineConfig(
        "megatron",
        (dp,) if tp == 1 else (dp, tp),
        c.zero_stage or 0,
        MEGATRON_RUNTIME,
        pp,
        virtual_stages=c.vpp or 1,
        sequence_parallel=bool(c.sp),
        recompute=c.recompute or "none",
    )


def _positive(fields: dict[str, str], key: str, text: str) -> int | None:
    value = fields.get(key)
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(
            "bad_baseline_config", f"{key} must be a positive integer in {text!r}, got {value!r}"
        )
    return int(value)


def _switch(fields: dict[str, str], text: str) -> bool | None:
    value = fields.get("sp")
    if value is None:
        return None
    if value not in _SWITCH:
        raise ConfigError("bad_baseline_config", f"sp must be on or off in {text!r}, got {value!r}")
    return _SWITCH[value]


RECOMPUTE_MODULES = {"core_attn": "attention_core", "layernorm": "norm"}
"""Megatron-Core's ``--recompute-modules`` of a dense transformer layer that autopar prices ->
the op group (:mod:`autopar.ir.blocks`) each recomputes (megatron/core/transformer/
transformer_config.py: ``core_attn`` the core attention, ``layernorm`` the
``input_layernorm`` and ``pre_mlp_layernorm``, their outputs dropped and recomputed)."""


def selective_groups(recompute: str) -> tuple[str, ...]:
    """The op groups ``selective`` or ``selective:M+M`` recomputes (``selective`` alone is
    Megatron-LM's default module, ``core_attn``)."""
    _, _, modules = recompute.partition(":")
    return tuple(RECOMPUTE_MODULES[m] for m in (modules.split("+") if modules else ["core_attn"]))


def _recompute(value: str | None, text: str) -> str | None:
    if value is None:
        return None
    if value in ("none", "selective", "full"):
        return value
    head, _, tail = value.partition(":")
    if head == "full" and tail.isdigit() and int(tail) >= 1:
        return f"full:{int(tail)}"
    modules = tail.split("+")
    if head == "selective" and tail and all(m in RECOMPUTE_MODULES for m in modules):
        return "selective:" + "+".join(m for m in RECOMPUTE_MODULES if m in modules)
    raise ConfigError(
        "bad_baseline_config",
        f"recompute must be none, selective, selective:M+M (modules {', '.join(RECOMPUTE_MODULES)}), "
        f"full or full:N (N layers per stage) in {text!r}, got {value!r}",
    )


def _optimizer(value: str | None, text: str) -> int | None:
    if value is None:
        return None
    if value not in _OPTIMIZER_NAMES:
        raise ConfigError(
            "bad_baseline_config", f"unknown optimizer {value!r} in {text!r}; use ddp, distributed or fsdp"
        )
    return _OPTIMIZER_NAMES[value]


def _check_choice(c: MegatronChoice, cluster: Cluster, text: str) -> None:
    """What Megatron-LM refuses before it starts, named with the numbers."""
    n, per_node = cluster.world_size, cluster.devices_per_node
    if c.tp is not None and per_node % c.tp:
        raise ConfigError(
            "bad_baseline_config",
            f"tp({c.tp}) must divide the {per_node} devices of a node (Megatron-LM keeps tensor "
            "parallelism inside a node)",
        )
    if c.pp is not None and cluster.nodes % c.pp:
        raise ConfigError(
            "bad_baseline_config",
            f"pp({c.pp}) must divide the {cluster.nodes} nodes (Megatron-LM pipelines across nodes)",
        )
    if None not in (c.tp, c.pp, c.dp) and (c.tp or 1) * (c.pp or 1) * (c.dp or 1) != n:
        raise ConfigError(
            "bad_baseline_config",
            f"tp({c.tp}) * dp({c.dp}) * pp({c.pp}) != devices({n}) of cluster {cluster}",
        )
    if c.sp and c.tp == 1:
        raise ConfigError(
            "bad_baseline_config",
            f"sp=on splits the sequence over the tensor-parallel group: it needs tp > 1 in {text!r}",
        )
    if c.zero_stage == 3 and c.pp is not None and c.pp > 1:
        raise ConfigError(
            "bad_baseline_config",
            f"optimizer=fsdp (Megatron-FSDP) runs without pipeline stages: pp=1 in {text!r}",
        )
    if c.vpp is not None and c.vpp > 1 and c.pp == 1:
        raise ConfigError("bad_baseline_config", f"vpp={c.vpp} interleaves pipeline stages: it needs pp >= 2")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def megatron_structures(
    cluster: Cluster, batch: int | None, blocks: int, micro_batches: int, choice: MegatronChoice
) -> list[BaselineConfig]:
    """Every ``tp, pp, dp, vpp, sp, optimizer`` the choice leaves open that Megatron-LM runs on
    ``cluster`` (recomputation unset: :mod:`autopar.baselines.search` finds the least that
    fits): ``tp`` divides the devices per node, ``pp`` the nodes and the ``blocks``, ``dp``
    the micro-batch's ``batch`` (None: not checked), ``vpp`` the layers of a stage with the
    micro-batches in groups of ``pp`` (:func:`autopar.pipeline.schedule.interleaving_refusal`),
    ``sp`` only with ``tp > 1``."""
    n, per_node = cluster.world_size, cluster.devices_per_node
    tps = [choice.tp] if choice.tp is not None else _divisors(per_node)
    pps = [choice.pp] if choice.pp is not None else _divisors(cluster.nodes)
    zeros = [choice.zero_stage] if choice.zero_stage is not None else sorted(MEGATRON_OPTIMIZERS)
    out: list[BaselineConfig] = []
    for pp in pps:
        if pp > 1 and (not blocks or blocks % pp):
            continue
        for tp in tps:
            dp = n // (pp * tp)
            if (choice.dp is not None and dp != choice.dp) or (batch is not None and batch % dp):
                continue
            for vpp in _virtual_stages(pp, blocks, micro_batches, choice):
                for sp in [choice.sp] if choice.sp is not None else ([False, True] if tp > 1 else [False]):
                    out.extend(
                        BaselineConfig(
                            "megatron",
                            (dp,) if tp == 1 else (dp, tp),
                            zero,
                            MEGATRON_RUNTIME,
                            pp,
                            virtual_stages=vpp,
                            sequence_parallel=bool(sp) and tp > 1,
                            recompute=choice.recompute or "",
                        )
                        for zero in zeros
                        if zero < 3 or pp == 1  # Megatron-FSDP runs without pipeline stages
                    )
    return out


def _virtual_stages(pp: int, blocks: int, k: int, choice: MegatronChoice) -> list[int]:
    if choice.vpp is not None:
        return [choice.vpp]
    per_stage = blocks // pp if blocks else 0
    return [v for v in VIRTUAL_STAGES if interleaving_refusal(pp, per_stage, k, v) is None]


def recompute_blocks(
    ordered: list[str], pipeline: int, virtual_stages: int, per_chunk: int
) -> tuple[str, ...]:
    """The blocks Megatron-LM's ``--recompute-method block --recompute-num-layers N`` recomputes:
    the first ``N = per_chunk`` layers of each model chunk (each stage's, or each interleaved
    chunk's: megatron/core/transformer/transformer_block.py ``_checkpointed_forward``),
    ``ordered`` being the graph's blocks in order."""
    chunks = pipeline * virtual_stages
    size = len(ordered) // chunks if chunks else len(ordered)
    return tuple(b for c in range(chunks) for b in ordered[c * size : c * size + min(per_chunk, size)])
