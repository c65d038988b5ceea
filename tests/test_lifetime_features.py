"""The feature groups with categorical features, worked out by hand."""

from __future__ import annotations

import pytest

from lavad.models.lifetime.features import (
    DECLARED_CATEGORICAL,
    LEVELS,
    _shape_name,
    lifetime_keys,
)

CASES = [
    # (tenant, deployment, features, categorical, expected keys finest first)
    # Without categorical features: the groups lavad always had, the tenant as
    # owner, and level 3 a second pool-wide group ("all").
    (
        "t1",
        "app",
        {"hour_of_day": 13, "batch_size": 3, "qos": "LS"},
        (),
        (("t1", "2c4g"), ("2c4g", 2, 2), ("2c4g",), ("all",), ()),
    ),
    # OpenB-like: qos and gpu_spec key levels 1-3 (in the order named); no
    # hour or batch size (None); no tenant, so the deployment owns level 0.
    (
        "",
        "app",
        {"qos": "LS", "gpu_spec": "G2"},
        ("qos", "gpu_spec"),
        (
            ("app", "2c4g"),
            ("2c4g", ("LS", "G2"), None, None),
            ("2c4g", ("LS", "G2")),
            (("LS", "G2"),),
            (),
        ),
    ),
    # A declared feature the request lacks, or one that is not a class (a
    # float), counts as None: it can neither fail nor split the groups.
    (
        "t",
        "",
        {"role": "HN", "preexisting": True, "qos": 0.5},
        DECLARED_CATEGORICAL,  # gpu_spec, preexisting, qos, role
        (
            ("t", "2c4g"),
            ("2c4g", (None, True, None, "HN"), None, None),
            ("2c4g", (None, True, None, "HN")),
            ((None, True, None, "HN"),),
            (),
        ),
    ),
    # Azure-like: none of the declared features present (the set test that
    # skips the lookups): every one counts as None, as when looked up.
    (
        "t",
        "",
        {"hour_of_day": 5, "batch_size": 1},
        DECLARED_CATEGORICAL,
        (
            ("t", "2c4g"),
            ("2c4g", (None, None, None, None), 0, 1),
            ("2c4g", (None, None, None, None)),
            ((None, None, None, None),),
            (),
        ),
    ),
]


@pytest.mark.parametrize(("tenant", "deployment", "features", "categorical", "expected"), CASES)
def test_keys_by_hand(
    tenant: str,
    deployment: str,
    features: dict[str, object],
    categorical: tuple[str, ...],
    expected: tuple[object, ...],
) -> None:
    keys = lifetime_keys(
        tenant, 2.0, 4.0, "", features, deployment=deployment, categorical=categorical
    )
    assert keys == expected
    assert len(keys) == LEVELS


def test_shape_names_of_flavourless_requests() -> None:
    """The shape key formats cores and GiB with ``g`` (cached, the same string each time);
    a flavour, where the request has one, is the shape."""
    for _ in range(2):
        assert lifetime_keys("t", 0.5, 1.75, "", {})[2] == ("0.5c1.75g",)
        assert lifetime_keys("t", 8.0, 56.0, "", {})[2] == ("8c56g",)
    assert lifetime_keys("t", 8.0, 56.0, "Standard_D13", {})[2] == ("Standard_D13",)


def test_a_stream_of_new_shapes_keeps_the_shape_cache_bounded() -> None:
    """Hostile input: every request a shape never seen (a producer sending random
    sizes). Each still gets its own exact name, and the cache holds no more than
    its size, whatever the stream's length."""
    bound = _shape_name.cache_info().maxsize
    assert bound is not None
    for i in range(bound + 500):
        cores = 1.0 + i / 1024
        assert lifetime_keys("t", cores, 1e6 + i, "", {})[2] == (f"{cores:g}c{1e6 + i:g}g",)
    assert _shape_name.cache_info().currsize <= bound
