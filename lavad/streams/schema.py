"""Event and decision schema, version 1: the one place the wire format is defined.

Events are what lavad reads (VM lifecycle, hosts, deployments, usage);
decisions are what it writes. Both are frozen, slotted dataclasses so that the
trace adapters and the core can build them at full speed without validation,
while the edge (``lavad.streams.codec``) decodes untrusted bytes straight into
the same classes with msgspec, whose constraints live in the ``Annotated``
field metadata below (``msgspec.Meta``) and are ignored by plain construction.

Units: time in seconds (float) from the trace or stream epoch; cores as
(fractional) vCPUs; memory, disk in GiB; GPUs as (fractional) devices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Literal

from msgspec import Meta

SCHEMA_VERSION: Final = 1

# Bounds of what one record may carry. Every string and collection an event
# holds is kept in memory (per VM, per pool) and copied into decisions, so
# none may grow without bound; the codec also bounds the raw record size.
MAX_ID_CHARS: Final = 256
MAX_NAME_CHARS: Final = 256
MAX_KEY_CHARS: Final = 128
MAX_VALUE_CHARS: Final = 256
MAX_ENTRIES: Final = 64
MAX_SAMPLES: Final = 4096
# Ids are keys, log fields and parts of decision ids: a NUL or newline in one
# corrupts whatever a consumer builds from it. C0 controls, DEL and C1 controls.
NO_CONTROL_CHARS: Final = "[\x00-\x1f\x7f-\x9f]"


class NoControlChars:
    """Field marker: the codec refuses a string holding any of ``NO_CONTROL_CHARS``.

    Checked by the codec after decoding rather than as a msgspec pattern:
    msgspec runs a pattern through Python's re, ~0.3 us a field, which was
    most of the cost of decoding an event.
    """


NO_CONTROL: Final = NoControlChars()

# Quantities (cores, GiB, GPUs) of a VM, host or deployment, far past any
# fleet's. Bounded so the models' arithmetic on them stays finite: a request
# of 1e300 cores overflowed the request mix's mean.
MAX_AMOUNT: Final = 1e9
# Usage, a multiple of the request (a burst may pass 1): a usage of 1e300
# times the request overflowed the limits' histogram and the usage moments,
# which stopped the engine on the record.
MAX_USAGE: Final = 1e6
# A usage interval: about 31 years.
MAX_INTERVAL_S: Final = 1e9

# The codec decodes strictly (a JSON true is not 1 and "8" is not 8; an int
# is still a float). Infinities and NaN cannot be written in JSON, and a
# number too large for a float is refused as out of range.
Amount = Annotated[float, Meta(ge=0.0, le=MAX_AMOUNT)]
PositiveAmount = Annotated[float, Meta(gt=0.0, le=MAX_AMOUNT)]
Usage = Annotated[float, Meta(ge=0.0, le=MAX_USAGE)]
Interval = Annotated[float, Meta(gt=0.0, le=MAX_INTERVAL_S)]
Time = Annotated[float, Meta(ge=0.0)]
Ident = Annotated[str, Meta(min_length=1, max_length=MAX_ID_CHARS), NO_CONTROL]
Name = Annotated[str, Meta(max_length=MAX_NAME_CHARS), NO_CONTROL]
_Key = Annotated[str, Meta(min_length=1, max_length=MAX_KEY_CHARS)]
_Value = Annotated[str, Meta(max_length=MAX_VALUE_CHARS)]

# Free-form request features (tenant history, flavor family, QoS, ...). Values
# are scalars so they hash and serialise the same way everywhere.
Features = dict[str, str | int | float | bool]
# The same as the edge validates it (the dataclasses are typed with the plain
# alias above, for the adapters and the core).
_ValidFeatures = Annotated[dict[_Key, _Value | bool | int | float], Meta(max_length=MAX_ENTRIES)]
Labels = Annotated[dict[_Key, _Value], Meta(max_length=MAX_ENTRIES)]


# --------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class VmRequest:
    """A VM (or pod/instance) asks to be placed."""

    time: Time
    pool: Ident
    vm_id: Ident
    cores: PositiveAmount
    memory_gib: Amount
    disk_gib: Amount = 0.0
    gpus: Amount = 0.0
    tenant: Name = ""
    deployment: Name = ""
    flavor: Name = ""
    # Anti-affinity: at most this many VMs of the same deployment per host.
    max_per_host: Annotated[int, Meta(ge=1)] | None = None
    features: _ValidFeatures = field(default_factory=dict)
    type: Literal["vm.request"] = "vm.request"
    v: Literal[1] = 1


@dataclass(frozen=True, slots=True)
class VmExit:
    """A VM left its host (finished, deleted or failed)."""

    time: Time
    pool: Ident
    vm_id: Ident
    type: Literal["vm.exit"] = "vm.exit"
    v: Literal[1] = 1


@dataclass(frozen=True, slots=True)
class VmPlaced:
    """An external scheduler placed a VM (shadow mode): lavad books it as given."""

    time: Time
    pool: Ident
    vm_id: Ident
    host_id: Ident
    cores: PositiveAmount
    memory_gib: Amount
    disk_gib: Amount = 0.0
    gpus: Amount = 0.0
    tenant: Name = ""
    deployment: Name = ""
    flavor: Name = ""
    features: _ValidFeatures = field(default_factory=dict)
    type: Literal["vm.placed"] = "vm.placed"
    v: Literal[1] = 1


@dataclass(frozen=True, slots=True)
class HostUp:
    """A host joins the pool (or comes back) with this capacity."""

    time: Time
    pool: Ident
    host_id: Ident
    cores: PositiveAmount
    memory_gib: PositiveAmount
    disk_gib: Amount = 0.0
    gpus: Amount = 0.0
    labels: Labels = field(default_factory=dict)
    type: Literal["host.up"] = "host.up"
    v: Literal[1] = 1


@dataclass(frozen=True, slots=True)
class HostDown:
    """A host left the pool; it must be empty (its VMs exited or were migrated)."""

    time: Time
    pool: Ident
    host_id: Ident
    type: Literal["host.down"] = "host.down"
    v: Literal[1] = 1


@dataclass(frozen=True, slots=True)
class HostDrain:
    """A host enters maintenance: it receives no new VMs from now on."""

    time: Time
    pool: Ident
    host_id: Ident
    type: Literal["host.drain"] = "host.drain"
    v: Literal[1] = 1


@dataclass(frozen=True, slots=True)
class DeploymentArrival:
    """A deployment asks to be admitted to the pool with an initial size."""

    time: Time
    pool: Ident
    deployment_id: Ident
    cores: Amount
    memory_gib: Amount = 0.0
    tenant: Name = ""
    features: _ValidFeatures = field(default_factory=dict)
    type: Literal["deployment.arrival"] = "deployment.arrival"
    v: Literal[1] = 1


@dataclass(frozen=True, slots=True)
class DeploymentScaleOut:
    """An admitted deployment asks for more capacity."""

    time: Time
    pool: Ident
    deployment_id: Ident
    cores: PositiveAmount
    memory_gib: Amount = 0.0
    type: Literal["deployment.scale_out"] = "deployment.scale_out"
    v: Literal[1] = 1


@dataclass(frozen=True, slots=True)
class DeploymentScaleIn:
    """A deployment gives capacity back."""

    time: Time
    pool: Ident
    deployment_id: Ident
    cores: PositiveAmount
    memory_gib: Amount = 0.0
    type: Literal["deployment.scale_in"] = "deployment.scale_in"
    v: Literal[1] = 1


@dataclass(frozen=True, slots=True)
class UsageStats:
    """One resource's usage over an interval, as a fraction of the VM's request.

    ``samples`` carries the raw per-sample values (a histogram in its simplest
    lossless form) when the source has them; mean and peak are always given.
    """

    mean: Usage
    peak: Usage
    samples: Annotated[tuple[Usage, ...], Meta(max_length=MAX_SAMPLES)] = ()


@dataclass(frozen=True, slots=True)
class UsageSample:
    """Measured usage of one VM or task over ``[time - interval_s, time)``."""

    time: Time
    pool: Ident
    vm_id: Ident
    interval_s: Interval
    cpu: UsageStats
    memory: UsageStats | None = None
    type: Literal["usage"] = "usage"
    v: Literal[1] = 1


Event = (
    VmRequest
    | VmExit
    | VmPlaced
    | HostUp
    | HostDown
    | HostDrain
    | DeploymentArrival
    | DeploymentScaleOut
    | DeploymentScaleIn
    | UsageSample
)

EVENT_TYPES: Final[dict[str, type[Any]]] = {
    "vm.request": VmRequest,
    "vm.exit": VmExit,
    "vm.placed": VmPlaced,
    "host.up": HostUp,
    "host.down": HostDown,
    "host.drain": HostDrain,
    "deployment.arrival": DeploymentArrival,
    "deployment.scale_out": DeploymentScaleOut,
    "deployment.scale_in": DeploymentScaleIn,
    "usage": UsageSample,
}


# ------------------------------------------------------------------ decisions

DecisionKind = Literal["placement", "admission", "migration", "limit", "replicas", "reprediction"]
DECISION_KINDS: Final[tuple[DecisionKind, ...]] = (
    "placement",
    "admission",
    "migration",
    "limit",
    "replicas",
    "reprediction",
)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a VM goes, or why it goes nowhere.

    ``host_id`` is None when no host fits; then ``retryable`` says whether the
    request may fit later (capacity is busy now) or never will (it is larger
    than any host, or the pool has no hosts at all and cannot grow).
    """

    decision_id: str
    time: float
    pool: str
    vm_id: str
    host_id: str | None
    policy: str
    reason: str
    retryable: bool = False
    explanation: dict[str, Any] = field(default_factory=dict)
    kind: Literal["placement"] = "placement"
    v: Literal[1] = 1


@dataclass(frozen=True, slots=True)
class Reprediction:
    """A lifetime policy changed its view of a VM or a host.

    ``subject`` "vm": the VM outlived its predicted exit and was repredicted
    from its uptime (``explanation``: uptime_s, predicted_remaining_s,
    predicted_exit). ``subject`` "host": a host's LAVA state or lifetime class
    changed (``explanation``: state, lifetime_class, previous ones, deadline,
    residual VMs). ``time`` is when the change took effect in event time.
    """

    decision_id: str
    time: float
    pool: str
    subject: Literal["vm", "host"]
    subject_id: str
    policy: str
    reason: str
    explanation: dict[str, Any] = field(default_factory=dict)
    kind: Literal["reprediction"] = "reprediction"
    v: Literal[1] = 1


@dataclass(frozen=True, slots=True)
class Limit:
    """A new CPU or memory limit for a VM (or task), from the usage stream.

    ``limit`` is in the usage stream's unit: a fraction of the VM's request.
    ``previous`` is the limit published before (None for the first).
    ``explanation``: recommender, statistic, window, half-life, margin and,
    for the ML recommender, the chosen model.
    """

    decision_id: str
    time: float
    pool: str
    vm_id: str
    resource: Literal["cpu", "memory"]
    limit: float
    previous: float | None
    policy: str
    reason: str
    explanation: dict[str, Any] = field(default_factory=dict)
    kind: Literal["limit"] = "limit"
    v: Literal[1] = 1


@dataclass(frozen=True, slots=True)
class Replicas:
    """A recommended replica count for a deployment (Autopilot's horizontal scaling).

    Published on the limits topic next to ``Limit``, as its own kind rather
    than a ``Limit`` with a made-up resource: a limit is about one VM and is
    a fraction of its request, while this is about a deployment (keyed by
    ``deployment_id``, the VM requests' ``deployment``) and is a whole count.
    A consumer of the limits topic dispatches on ``kind`` and never has to
    guess which fields of a limit mean something else for replicas.

    Schema version: a new decision kind is additive, so records stay
    ``v`` 1: no field of an existing kind changed, and a consumer that reads
    ``kind`` first can skip a kind it does not know. A change to these
    fields would be a new version.

    ``replicas`` is the recommended count from ``time`` on; ``previous`` the
    count recommended before (None the first time the deployment is seen).
    ``explanation``: observed_replicas (VMs of the deployment that reported
    usage in the window), window_usage (their summed mean CPU, in units of
    one VM's request), statistic and usage_statistic (that statistic of the
    summed usage over horizon_s), target_utilization, raw (usage_statistic /
    target_utilization, rounded up), stabilized (the largest raw of the last
    downscale_delay_s), step ("first", "at-target", "growth-limited" while
    new replicas initialise, "decaying" towards the stabilised count).
    """

    decision_id: str
    time: float
    pool: str
    deployment_id: str
    replicas: int
    previous: int | None
    policy: str
    reason: str
    explanation: dict[str, Any] = field(default_factory=dict)
    kind: Literal["replicas"] = "replicas"
    v: Literal[1] = 1


@dataclass(frozen=True, slots=True)
class Admission:
    """Whether a deployment may join the pool (``request`` "arrival") or grow ("scale_out").

    An arrival is decided by the admission policy; ``explanation`` has the
    threshold, the binding horizon and look-ahead time and the estimated
    probability of running over capacity there. A scale-out of an admitted
    deployment is granted while the capacity allows; a refused one is the
    SLA failure the policies trade utilisation against.
    """

    decision_id: str
    time: float
    pool: str
    deployment_id: str
    request: Literal["arrival", "scale_out"]
    admitted: bool
    cores: float
    policy: str
    reason: str
    explanation: dict[str, Any] = field(default_factory=dict)
    kind: Literal["admission"] = "admission"
    v: Literal[1] = 1


@dataclass(frozen=True, slots=True)
class Migration:
    """A step of a drain: a host being emptied by live migration (LARS, LAVA paper 4.4).

    ``drain`` says why the host drains: "defragmentation" (lavad chose it
    because empty hosts ran short; it returns to service once empty),
    "maintenance" (a host.drain event; it stays closed until host.up) or
    "relief" (a GPA host whose realised overflows reject its promise sheds
    some of its VMs, listed in the plan; ``host_ready`` then means those
    are gone and the host is back in service with the others).

    ``action``:

    * "plan": the host's VMs still to move, in the order they will go
      (``plan``: vm_id, predicted_remaining_s and queue_position, the place
      in the pool-wide queue across all draining hosts). Published when the
      drain starts and again whenever a queued VM exits before its turn.
    * "migrate": ``vm_id`` starts moving from ``host_id`` to
      ``target_host_id``, chosen by the placement policy; both hosts are busy
      until ``explanation["until"]``.
    * "host_ready": ``host_id`` has no VMs and no migration in flight.

    ``policy`` names the migration order ("lars", "arrival", "shortest",
    "random").
    """

    decision_id: str
    time: float
    pool: str
    action: Literal["plan", "migrate", "host_ready"]
    host_id: str
    drain: Literal["defragmentation", "maintenance", "relief"]
    policy: str
    reason: str
    vm_id: str | None = None
    target_host_id: str | None = None
    plan: list[dict[str, Any]] = field(default_factory=list)
    explanation: dict[str, Any] = field(default_factory=dict)
    kind: Literal["migration"] = "migration"
    v: Literal[1] = 1


Decision = Placement | Reprediction | Limit | Replicas | Admission | Migration
