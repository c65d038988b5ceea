"""Everything chosen by name is a Registry: names from one place, errors naming the key."""

from __future__ import annotations

from typing import get_args

import pytest
from pydantic import BaseModel, ConfigDict, Field

from lavad.core.admission.registry import ADMISSION_POLICIES
from lavad.core.limits.service import RECOMMENDER_REGISTRY, RECOMMENDERS, RecommenderFactory
from lavad.core.migrations.config import LifetimeSource, OrderName
from lavad.core.migrations.lifetimes import (
    LIFETIME_SOURCES,
    NoLifetimes,
    OracleLifetimes,
    OwnLifetimes,
)
from lavad.core.migrations.orders import (
    ORDERS,
    ArrivalOrder,
    LongestRemainingFirst,
    RandomOrder,
    ShortestRemainingFirst,
)
from lavad.core.placement.framework import UniformDraws
from lavad.core.registry import Entry, Registry, RegistryError
from lavad.daemon.settings import AdmissionSettings
from lavad.models.limits.choice import ChoiceRecommender
from lavad.models.limits.ml import MlRecommender
from lavad.models.limits.vpa import VpaRecommender
from lavad.models.limits.window import MovingWindowRecommender


def test_the_configurations_names_are_the_registries_names() -> None:
    # The typed config fields list the same names the registries hold.
    assert ORDERS.names == get_args(OrderName)
    assert LIFETIME_SOURCES.names == get_args(LifetimeSource)
    assert ("off", *RECOMMENDER_REGISTRY.names) == RECOMMENDERS
    admission = get_args(AdmissionSettings.model_fields["policy"].annotation)
    assert admission == ("off", *ADMISSION_POLICIES.names)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("lars", LongestRemainingFirst),
        ("arrival", ArrivalOrder),
        ("shortest", ShortestRemainingFirst),
        ("random", RandomOrder),
    ],
)
def test_each_order_builds_its_own_class(name: str, kind: type) -> None:
    import numpy as np  # noqa: PLC0415

    assert isinstance(ORDERS.build(name, None, UniformDraws(np.random.default_rng(0))), kind)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("ml", ChoiceRecommender),
        ("ml-ensemble", MlRecommender),
        ("vpa", VpaRecommender),
        ("window-p95", MovingWindowRecommender),
    ],
)
def test_each_recommender_builds_its_own_class(name: str, kind: type) -> None:
    assert isinstance(RecommenderFactory(name)("cpu"), kind)


@pytest.mark.parametrize(
    ("source", "tracker", "drains", "kind"),
    [
        # No policy tracker (Best Fit): "policy" keeps a model only when the pool drains itself.
        ("policy", None, False, NoLifetimes),
        ("policy", None, True, OwnLifetimes),
        ("model", None, False, OwnLifetimes),
        ("oracle", None, False, OracleLifetimes),
    ],
)
def test_lifetime_sources_follow_the_policy_and_the_drains(
    source: str, tracker: None, drains: bool, kind: type
) -> None:
    assert isinstance(LIFETIME_SOURCES.build(source, None, tracker, drains), kind)


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    size: int = Field(default=1, ge=1)


def test_a_registry_names_the_key_of_a_bad_name_or_argument() -> None:
    registry: Registry[int] = Registry("widget", [Entry("w", "a widget", lambda a: a.size, _Args)])
    with pytest.raises(RegistryError) as unknown:
        registry.validate("v", {}, "widgets.kind")
    assert unknown.value.key == "widgets.kind"
    assert "unknown widget 'v'; known: w" in unknown.value.reason
    with pytest.raises(RegistryError) as bad:
        registry.validate("w", {"size": 0}, "widgets.args")
    assert bad.value.key == "widgets.args.size"
    with pytest.raises(RegistryError) as extra:
        registry.validate("w", {"colour": "red"}, "widgets.args")
    assert extra.value.key == "widgets.args.colour"
    assert registry.build("w", registry.validate("w", {"size": 3}, "k")) == 3


def test_a_registry_refuses_two_entries_of_one_name() -> None:
    with pytest.raises(ValueError, match="named twice: w"):
        Registry("widget", [Entry("w", "", lambda a: 1), Entry("w", "", lambda a: 2)])
