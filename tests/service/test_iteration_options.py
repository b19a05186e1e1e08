"""``options.micro_batches`` and ``options.checkpointing`` in the API's requests and plan key."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from autopar.cluster import Cluster
from autopar.models import build
from autopar_service.requests import SolverOptionsBody, build_request, key_dict_of
from autopar_service.settings import Settings


def _key(**options: object) -> dict[str, object]:
    request = build_request(
        build("tiny-gpt"), Cluster.parse("1x4"), [2, 2], None, 2, SolverOptionsBody(**options), Settings()
    )
    return key_dict_of(request)


def test_the_iteration_is_part_of_the_plan_key_and_the_default_key_is_unchanged() -> None:
    default = _key()
    assert "micro_batches" not in default["options"] and "checkpointing" not in default["options"]
    assert _key(micro_batches=1, checkpointing="off") == default
    eight = _key(micro_batches=8)
    assert eight != default and eight["options"]["micro_batches"] == 8
    assert _key(micro_batches=8, checkpointing="full") != eight


@pytest.mark.parametrize("options", [{"micro_batches": 0}, {"micro_batches": "8"}, {"checkpointing": "some"}])
def test_bad_iteration_options_are_refused(options: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        SolverOptionsBody(**options)
