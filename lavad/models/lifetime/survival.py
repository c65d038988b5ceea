"""The life-table estimator and the repredictions it gives, vectorised.

Counts per bin j: ``deaths[j]`` lifetimes that ended in bin j and
``censored[j]`` lifetimes known only to exceed a point in bin j (VMs still
running, VMs evicted, VMs alive at the end of a recording). The actuarial
life table (binned Kaplan-Meier) treats a censored lifetime as at risk for
half of its bin:

    at_risk[j] = N - sum_{i<j} (deaths[i] + censored[i]) - censored[j] / 2
    hazard[j]  = deaths[j] / at_risk[j]
    S[j]       = prod_{i<=j} (1 - hazard[i])   (survival past bin j)

so censoring lowers no hazard it should not: a VM still running says only
that lifetimes reach at least its uptime. The probability mass left past the
last bin with data goes to the open bin beyond the horizon.

Repredictions, for a VM of uptime u in bin j (mass taken as uniform inside
a bin):

    E[T | T > u] = (m_j * f * r(u) + M1[j+1]) / (m_j * f + M0[j+1])
    E[T_r | T_u] = E[T | T > u] - u

with f = (e_{j+1} - u) / (e_{j+1} - e_j) the part of bin j still ahead,
r(u) = sqrt(u * e_{j+1}) its representative lifetime (as whole bins use the
geometric mean of their edges; (u + e_1) / 2 in the first bin), and M0/M1
the suffix sums of mass and mass * representative lifetime. A VM that
outlived all the mass (no mass left ahead) is given E[T_r | T_u] = u, the
heavy-tail rule "it will live about as long again" (Lindy), rather than 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numba
import numpy as np

from lavad.models.arrays import FloatArray
from lavad.models.lifetime.bins import LifetimeBins


class LifeTables(Protocol):
    """Distributions over ``bins``, one per row: what the repredictions below read.

    Every lifetime model is one (``LifetimeModel``); ``Tables`` holds
    plain arrays as one.
    """

    @property
    def bins(self) -> LifetimeBins:
        """The support of every distribution."""
        ...

    @property
    def mass(self) -> FloatArray:
        """Per distribution row, the probability of each bin."""
        ...

    @property
    def m0(self) -> FloatArray:
        """Per row, the mass at or after each bin (``suffix_sums``)."""
        ...

    @property
    def m1(self) -> FloatArray:
        """Per row, the first moment of the mass at or after each bin."""
        ...


@dataclass(frozen=True, slots=True)
class Tables:
    """``LifeTables`` from arrays: a study's fitted tables, or a model's member."""

    bins: LifetimeBins
    mass: FloatArray
    m0: FloatArray
    m1: FloatArray


def life_table(
    deaths: FloatArray, censored: FloatArray, tail_hazard: FloatArray | None = None
) -> FloatArray:
    """Probability mass per bin (rows = groups), from death and censoring counts.

    Past a group's last observation the data say nothing. Without
    ``tail_hazard`` all the survival left there goes to the open bin beyond
    the horizon; with it (``LifetimeBins.pareto_tail_hazard``), those bins
    get that hazard, so a group whose longest VMs are still running does not
    predict the horizon for all of them. A group with no observation at all
    is uniform over the (log-spaced) bins.

    Computed row by row in one compiled pass (``_fill_life_table``), in the
    floating-point order of the numpy expressions it replaced (a test holds
    them equal to the bit): numpy's row sums are pairwise, its cumulative
    sums and products sequential.
    """
    deaths, censored = np.broadcast_arrays(np.atleast_2d(deaths), np.atleast_2d(censored))
    deaths = np.ascontiguousarray(deaths, dtype=np.float64)
    censored = np.ascontiguousarray(censored, dtype=np.float64)
    mass: FloatArray = np.empty(deaths.shape)
    use_tail = tail_hazard is not None
    tail = np.ascontiguousarray(tail_hazard if use_tail else np.zeros(0), dtype=np.float64)
    if use_tail and tail.shape != (deaths.shape[1],):
        raise ValueError(f"a tail hazard per bin: {tail.shape} for {deaths.shape[1]} bins")
    _fill_life_table(deaths, censored, tail, use_tail, mass)
    return mass


@numba.njit(cache=True, nogil=True)
def _block_sum(values: FloatArray, lo: int, n: int) -> float:
    """numpy's pairwise sum of ``values[lo:lo + n]`` for n <= 128: sequential below 8,
    else 8 running sums over the whole blocks of 8, paired, then the rest in turn."""
    if n < 8:
        total = 0.0
        for i in range(n):
            total += values[lo + i]
        return total
    r0 = values[lo]
    r1 = values[lo + 1]
    r2 = values[lo + 2]
    r3 = values[lo + 3]
    r4 = values[lo + 4]
    r5 = values[lo + 5]
    r6 = values[lo + 6]
    r7 = values[lo + 7]
    i = 8
    whole = n - n % 8
    while i < whole:
        r0 += values[lo + i]
        r1 += values[lo + i + 1]
        r2 += values[lo + i + 2]
        r3 += values[lo + i + 3]
        r4 += values[lo + i + 4]
        r5 += values[lo + i + 5]
        r6 += values[lo + i + 6]
        r7 += values[lo + i + 7]
        i += 8
    paired: float = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        paired += values[lo + i]
        i += 1
    return paired


@numba.njit(cache=True, nogil=True)
def _pairwise_sum(values: FloatArray, lo: int, n: int) -> float:
    """Sum of ``values[lo:lo + n]`` in numpy's order (its ``add.reduce`` of a contiguous
    row): ``_block_sum`` up to 128, beyond that the sum of two halves (the first a
    whole number of blocks of 8). numpy recurses; numba cannot cache a recursive
    function, so an explicit stack walks the same tree (64 levels halve any size)."""
    if n <= 128:
        return _block_sum(values, lo, n)
    starts = np.empty(64, dtype=np.int64)
    sizes = np.empty(64, dtype=np.int64)
    phase = np.zeros(64, dtype=np.int64)
    left = np.empty(64)
    depth = 0
    starts[0] = lo
    sizes[0] = n
    result = 0.0
    while depth >= 0:
        start = starts[depth]
        size = sizes[depth]
        if size <= 128:
            result = _block_sum(values, start, size)
            depth -= 1
            continue
        half = size // 2
        half -= half % 8
        if phase[depth] == 0:  # the first half
            phase[depth] = 1
            depth += 1
            starts[depth], sizes[depth], phase[depth] = start, half, 0
        elif phase[depth] == 1:  # the second half, the first's sum kept
            left[depth] = result
            phase[depth] = 2
            depth += 1
            starts[depth], sizes[depth], phase[depth] = start + half, size - half, 0
        else:
            result = left[depth] + result
            depth -= 1
    return result


@numba.njit(cache=True, nogil=True)
def _fill_life_table(
    deaths: FloatArray,
    censored: FloatArray,
    tail_hazard: FloatArray,
    use_tail: bool,
    mass: FloatArray,
) -> None:
    """``life_table`` into ``mass``: per row, its total (numpy's ``sum(axis=1)``, from 0.0),
    then at risk, hazard (clipped to [0, 1]; the tail's past the last bin with data),
    survival and mass bin by bin (numpy's cumsum and cumprod: sequential)."""
    rows, width = deaths.shape
    for g in range(rows):
        d = deaths[g]
        c = censored[g]
        total = (0.0 + _pairwise_sum(d, 0, width)) + (0.0 + _pairwise_sum(c, 0, width))
        if total == 0.0:
            for j in range(width):
                mass[g, j] = 1.0 / width
            continue
        # The last bin with a death or censoring (the last bin when none).
        last_seen = width - 1
        if use_tail:
            for j in range(width - 1, -1, -1):
                if d[j] + c[j] > 0:
                    last_seen = j
                    break
        running = 0.0
        before = 1.0
        survival = 1.0
        for j in range(width):
            both = d[j] + c[j]
            running += both
            leaving = running - both
            at_risk = total - leaving - c[j] / 2.0
            hazard = d[j] / at_risk if at_risk > 0 else 0.0
            if hazard < 0.0:
                hazard = 0.0
            elif hazard > 1.0:
                hazard = 1.0
            if use_tail and last_seen < j < width - 1:
                hazard = tail_hazard[j]
            survival = before * (1.0 - hazard)
            mass[g, j] = before - survival
            before = survival
        # What survives the last bin lives beyond it (the open bin is the last one).
        mass[g, width - 1] += survival


def suffix_sums(mass: FloatArray, bins: LifetimeBins) -> tuple[FloatArray, FloatArray]:
    """M0[g, j] = sum_{i>=j} mass; M1 the same of mass * representative (plus a 0 column)."""
    moment = mass * bins.representative
    zeros = np.zeros((len(mass), 1))
    m0 = np.concatenate([np.cumsum(mass[:, ::-1], axis=1)[:, ::-1], zeros], axis=1)
    m1 = np.concatenate([np.cumsum(moment[:, ::-1], axis=1)[:, ::-1], zeros], axis=1)
    return m0, m1


@numba.njit(cache=True, nogil=True)
def fill_suffix_sums(
    mass: FloatArray,
    representative: FloatArray,
    m0: FloatArray,
    m1: FloatArray,
    out: int,
    source: int = -1,
) -> None:
    """Row ``out`` of ``m0`` and ``m1`` from row ``source`` of ``mass`` (``out`` when -1),
    in a compiled loop: what ``suffix_sums`` gives for one row (summed from the last
    bin, as its reversed cumsum is, so the same to the bit)."""
    width = mass.shape[1]
    src = out if source < 0 else source
    s0 = 0.0
    s1 = 0.0
    m0[out, width] = 0.0
    m1[out, width] = 0.0
    for j in range(width - 1, -1, -1):
        s0 += mass[src, j]
        s1 += mass[src, j] * representative[j]
        m0[out, j] = s0
        m1[out, j] = s1


def _ahead(
    bins: LifetimeBins,
    mass: FloatArray,
    m0: FloatArray,
    m1: FloatArray,
    rows: np.ndarray,
    u: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """Mass ahead of uptime u, and its first moment, per VM (``rows`` and ``u`` broadcast).

    One compiled pass (``_ahead_into``): as a dozen numpy passes it cost about
    40 µs for a single VM, the size of most live repredictions.
    """
    index = np.asarray(rows)
    if index.shape != u.shape or index.ndim != 1:
        index, u = np.broadcast_arrays(index, u)
    shape = u.shape
    flat_rows = np.ascontiguousarray(index.ravel(), dtype=np.int64)
    flat_u = np.ascontiguousarray(u.ravel(), dtype=np.float64)
    ahead = np.empty(len(flat_u))
    moment = np.empty(len(flat_u))
    _ahead_into(bins.edges, bins.representative, mass, m0, m1, flat_rows, flat_u, ahead, moment)
    return ahead.reshape(shape), moment.reshape(shape)


def warm_up_survival() -> None:
    """Compile (or load) ``_ahead_into`` for the model's array types before anything is
    timed: the first reprediction would otherwise pay for it."""
    one = np.zeros(1)
    table = np.zeros((1, 3))
    _ahead_into(
        np.array([0.0, 1.0]), np.ones(2), table, table, table,
        np.zeros(1, dtype=np.int64), one, one.copy(), one.copy(),
    )  # fmt: skip


@numba.njit(cache=True, nogil=True)
def _ahead_into(
    edges: FloatArray,
    representative: FloatArray,
    mass: FloatArray,
    m0: FloatArray,
    m1: FloatArray,
    rows: np.ndarray,
    u: FloatArray,
    ahead: FloatArray,
    moment: FloatArray,
) -> None:
    """Per VM, the mass ahead of its uptime and that mass's first moment, into
    ``ahead`` and ``moment``.

    The vectorised form's operations in its order, one VM at a time (a
    negative bin wraps as numpy's indexing does; no fused multiply-add), so
    the same numbers: a test holds them equal bit for bit.
    """
    last = len(edges) - 1  # the open bin
    open_lifetime = representative[-1]
    tables = min(mass.shape[0], m0.shape[0], m1.shape[0])
    for i in range(len(u)):
        x = u[i]
        row = rows[i]
        if not 0 <= row < tables:
            # Compiled, such a row would read outside the tables (a row from
            # a damaged snapshot, say); numpy refused one past the end and
            # took a negative one from the end, which no model row is.
            raise IndexError("a VM's distribution row is outside the life tables")
        j = bin_of(edges, x)
        if j < last:
            lo = edges[min(j, last - 1)]
            hi = edges[min(j + 1, last)]
            part = min(max((hi - x) / (hi - lo), 0.0), 1.0)
            # The rest of bin j is represented as whole bins are: by the
            # geometric mean of its ends (arithmetic in the first bin, which
            # starts at 0).
            middle = (x + hi) / 2.0 if j == 0 else np.sqrt(max(x, lo) * hi)
        else:
            part = 1.0
            doubled = x * 2.0
            # np.maximum's: NaN if either is.
            middle = doubled if doubled > open_lifetime or np.isnan(doubled) else open_lifetime
        here = mass[row, j] * part
        ahead[i] = here + m0[row, j + 1]
        moment[i] = here * middle + m1[row, j + 1]


def ahead_of(tables: LifeTables, rows: np.ndarray, uptime: FloatArray) -> FloatArray:
    """The mass ahead of each VM's uptime (P(T > u) of its row, as ``_ahead`` counts it)."""
    u = np.asarray(uptime, dtype=np.float64)
    ahead, _ = _ahead(tables.bins, tables.mass, tables.m0, tables.m1, rows, u)
    return ahead


def expected_remaining(tables: LifeTables, rows: np.ndarray, uptime: FloatArray) -> FloatArray:
    """E[T_r | T_u] per VM: ``rows`` picks each VM's distribution, ``uptime`` its T_u."""
    u = np.asarray(uptime, dtype=np.float64)
    ahead, moment = _ahead(tables.bins, tables.mass, tables.m0, tables.m1, rows, u)
    with np.errstate(divide="ignore", invalid="ignore"):
        remaining = np.where(ahead > 1e-12, moment / ahead - u, u)
    return np.maximum(remaining, 0.0)


def survival_beyond(
    tables: LifeTables, rows: np.ndarray, threshold: float, uptime: FloatArray
) -> FloatArray:
    """P(T > threshold | T > uptime) per VM (1 where threshold <= uptime)."""
    u = np.asarray(uptime, dtype=np.float64)
    bins, mass, m0, m1 = tables.bins, tables.mass, tables.m0, tables.m1
    ahead_u, _ = _ahead(bins, mass, m0, m1, rows, u)
    t = np.maximum(np.full_like(u, threshold), u)
    ahead_t, _ = _ahead(bins, mass, m0, m1, rows, t)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ahead_u > 1e-12, np.clip(ahead_t / ahead_u, 0.0, 1.0), 1.0)


def survival_at(tables: LifeTables, rows: np.ndarray, lifetimes: FloatArray) -> FloatArray:
    """P(T > t) at creation per VM, each at its own ``lifetimes`` t."""
    t = np.asarray(lifetimes, dtype=np.float64)
    m0 = tables.m0
    ahead, _ = _ahead(tables.bins, tables.mass, m0, tables.m1, rows, t)
    total = m0[rows, 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        result: FloatArray = np.where(total > 1e-12, np.clip(ahead / total, 0.0, 1.0), 1.0)
    return result


def median_remaining(tables: LifeTables, rows: np.ndarray, uptime: FloatArray) -> FloatArray:
    """The median of T_r given T_u per VM: t - u where P(T > t | T > u) = 1/2.

    Mass is uniform in time inside a bin (as ``expected_remaining`` takes
    it), so the median is found by linear interpolation in the bin where the
    mass ahead falls to half. In the open bin beyond the horizon it is the
    bin's representative lifetime (or twice the uptime, if later). A VM
    with no mass ahead gets its uptime (the Lindy rule, as the mean does).
    """
    u = np.asarray(uptime, dtype=np.float64)
    bins, mass, m0, m1 = tables.bins, tables.mass, tables.m0, tables.m1
    edges = bins.edges
    last = len(edges) - 1
    j = bins.index(u)
    ahead, _ = _ahead(bins, mass, m0, m1, rows, u)
    half = ahead / 2.0
    columns = np.arange(m0.shape[1])
    # The first edge k > j whose suffix mass is at most half: the median is
    # in bin k - 1 (or in the rest of bin j when k = j + 1).
    past = (m0[rows] <= half[:, None] + 1e-15) & (columns[None, :] > j[:, None])
    k = np.argmax(past, axis=1)
    b = k - 1
    in_open = (b >= last) | ~past.any(axis=1)
    b_safe = np.minimum(b, last - 1)
    lo = np.where(b == j, u, edges[b_safe])
    hi = edges[np.minimum(b_safe + 1, last)]
    # Mass of bin b from lo on, and what must be crossed in it to reach half.
    start_mass = np.where(b == j, ahead - m0[rows, np.minimum(j + 1, last + 1)], mass[rows, b_safe])
    need = np.where(b == j, ahead - half, m0[rows, b_safe] - half)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(start_mass > 1e-15, np.clip(need / start_mass, 0.0, 1.0), 0.0)
    t = lo + share * (hi - lo)
    t = np.where(in_open, np.maximum(bins.representative[-1], 2.0 * u), t)
    remaining = np.where(ahead > 1e-12, t - u, u)
    result: FloatArray = np.maximum(remaining, 0.0)
    return result


def midpoint_levels(count: int) -> FloatArray:
    """``count`` evenly spread quantile levels, (k + 1/2) / count: each stands for 1/count."""
    if count < 1:
        raise ValueError(f"need at least one quantile, got {count}")
    levels: FloatArray = (np.arange(count, dtype=np.float64) + 0.5) / count
    return levels


def remaining_quantiles(
    tables: LifeTables, rows: np.ndarray, uptime: FloatArray, levels: FloatArray
) -> FloatArray:
    """Quantiles of T_r given T_u, (VMs, levels): t - u where P(T <= t | T > u) = level.

    The same distribution ``expected_remaining`` and ``median_remaining``
    read: mass uniform in time inside a bin, the part of bin j ahead of the
    uptime u spread over [u, e_{j+1}), the open bin beyond the horizon a
    point at its representative lifetime (or 2u, if later). A VM with no
    mass ahead gets u at every level (the Lindy rule of the mean).
    """
    u = np.asarray(uptime, dtype=np.float64)
    rows = np.asarray(rows, dtype=np.int64)
    levels = np.asarray(levels, dtype=np.float64)
    bins, mass, m0, m1 = tables.bins, tables.mass, tables.m0, tables.m1
    edges = bins.edges
    last = len(edges) - 1  # the open bin
    width = mass.shape[1]
    j = bins.index(u)
    ahead, _ = _ahead(bins, mass, m0, m1, rows, u)
    columns = np.arange(width)
    # The mass ahead of u per bin: nothing before bin j, part of bin j.
    here = mass[rows] * (columns[None, :] >= j[:, None])
    np.put_along_axis(
        here, j[:, None], (ahead - m0[rows, np.minimum(j + 1, width)])[:, None], axis=1
    )
    cumulative = np.cumsum(here, axis=1)
    target = levels[None, :] * ahead[:, None]  # (VMs, levels)
    # The first bin whose cumulative mass reaches the target.
    k = (cumulative[:, None, :] < target[:, :, None] - 1e-15).sum(axis=2)
    k = np.minimum(k, last)
    in_bin = np.take_along_axis(here, k, axis=1)
    before = np.take_along_axis(cumulative, k, axis=1) - in_bin
    k_inner = np.minimum(k, last - 1)
    lo = np.where(k == j[:, None], u[:, None], edges[k_inner])
    hi = edges[k_inner + 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(in_bin > 1e-15, np.clip((target - before) / in_bin, 0.0, 1.0), 0.0)
    t = lo + share * (hi - lo)
    t = np.where(k >= last, np.maximum(bins.representative[-1], 2.0 * u)[:, None], t)
    t = np.where((ahead > 1e-12)[:, None], t, 2.0 * u[:, None])
    result: FloatArray = np.maximum(t - u[:, None], 0.0)
    return result


@numba.njit(cache=True, nogil=True, inline="always")
def bin_of(edges: FloatArray, t: float) -> int:
    """``searchsorted(edges, t, side="right") - 1``, compiled: the bin of lifetime ``t``
    (``LifetimeBins.index``), as the kernels count an exit and read a VM's uptime."""
    lo = 0
    hi = len(edges)
    while lo < hi:
        mid = (lo + hi) // 2
        if t < edges[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo - 1


@numba.njit(cache=True, nogil=True)
def remaining_quantiles_into(
    mass: FloatArray,
    m0: FloatArray,
    row: int,
    u: float,
    edges: FloatArray,
    open_lifetime: float,
    levels: FloatArray,
    out: FloatArray,
    h: int,
) -> None:
    """``remaining_quantiles`` of one VM (its row and uptime u) into ``out[h]``, compiled.

    The same operations in the same order as numpy's (a bin's mass times 1.0
    or 0.0, a sequential cumulative sum, no fused multiply-add), so the same
    numbers; a test holds them equal on random tables and uptimes. The
    placement kernels write a host's row of quantiles with it, in place.
    """
    width = mass.shape[1]
    last = len(edges) - 1  # the open bin
    j = min(bin_of(edges, u), last)
    # _ahead: the mass ahead of u
    inner = j < last
    lo_edge = edges[min(j, last - 1)]
    hi_edge = edges[min(j + 1, last)]
    part = min(max((hi_edge - u) / (hi_edge - lo_edge), 0.0), 1.0) if inner else 1.0
    ahead = mass[row, j] * part + m0[row, j + 1]
    here = np.empty(width)
    cumulative = np.empty(width)
    for c in range(width):
        here[c] = mass[row, c] * (1.0 if c >= j else 0.0)
    here[j] = ahead - m0[row, min(j + 1, width)]
    total = 0.0
    for c in range(width):
        total += here[c]
        cumulative[c] = total
    for q in range(len(levels)):
        target = levels[q] * ahead
        k = 0
        for c in range(width):
            if cumulative[c] < target - 1e-15:
                k += 1
        k = min(k, last)
        in_bin = here[k]
        before = cumulative[k] - in_bin
        k_inner = min(k, last - 1)
        lo = u if k == j else edges[k_inner]
        hi = edges[k_inner + 1]
        share = min(max((target - before) / in_bin, 0.0), 1.0) if in_bin > 1e-15 else 0.0
        t = lo + share * (hi - lo)
        if k >= last:
            t = max(open_lifetime, 2.0 * u)
        if not ahead > 1e-12:
            t = 2.0 * u
        out[h, q] = max(t - u, 0.0)


def creation_quantiles(tables: LifeTables, row: int, levels: FloatArray) -> FloatArray:
    """``remaining_quantiles(..., [row], [0.0], levels)[0]``, compiled: the same numbers.

    A VM's quantiles at creation are asked once per distribution row and
    refit; with one row per key tuple (``ShrunkLifeTables``) that is once per
    new tenant, where numpy's ~20 calls cost ~100 us.
    """
    # Uptime 0 is in bin 0 (edges[0] = 0 < edges[1]): all of its mass is ahead.
    out: FloatArray = np.empty((1, len(levels)))
    bins = tables.bins
    open_lifetime = float(bins.representative[-1])
    remaining_quantiles_into(
        tables.mass, tables.m0, row, 0.0, bins.edges, open_lifetime, levels, out, 0
    )
    quantiles: FloatArray = out[0]
    return quantiles
