"""A global scheduler killed with kill -9 mid-stream, on the embedded broker: one pool
owner and 2 schedulers as processes. The owner is frozen (SIGSTOP) while the
schedulers launch a wave of requests, so the killed scheduler dies with launches
unanswered and their requests not final (not committed). Its tenant queue moves to
the survivor, which must neither lose those requests nor launch them again; then the
killed scheduler is restarted under the same index, takes a queue back, and its
launches must not be refused as out of order. Every request ends with exactly one
accepted launch, no launch id is sent twice, no host is over capacity. The owner stays
frozen until the survivor has taken the queue over, so the survivor finds the dead
scheduler's launches unanswered and waits for their verdicts. The time from the kill
to the survivor's first launch for the moved queue is printed."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from federation_live_support import (
    create_topics,
    federation_config,
    launches,
    produce,
    start,
    stop_all,
    taken_partitions,
    tasks,
    until,
    verdicts,
)

from lavad.streams.kafka.embedded import EmbeddedBroker

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

POOLS = 2
HOSTS = 100  # per pool, one slot each: room for every request (tasks never end here)
WAVE = 20  # requests per tenant queue per wave


async def test_kill_9_a_scheduler_then_restart_it(broker: EmbeddedBroker, tmp_path: Path) -> None:
    bootstrap = broker.bootstrap_servers
    await create_topics(bootstrap, pools=POOLS, queues=2)
    logs = {name: tmp_path / f"{name}.log" for name in ("owner", "gm0", "gm1", "gm1-again")}
    config = str(
        federation_config(tmp_path / "f.toml", bootstrap, pools=POOLS, hosts_per_pool=HOSTS)
    )
    owner = start(logs["owner"], "owner", "--instance", "a", "--config", config)

    def scheduler(gm: int, log: str) -> subprocess.Popen[bytes]:
        return start(logs[log], "scheduler", "--gm", str(gm), "--config", config)

    gms = {g: scheduler(g, f"gm{g}") for g in (0, 1)}
    processes = [owner, *gms.values()]
    try:

        async def both_hold_a_queue() -> bool:
            return (
                all(taken_partitions(logs[f"gm{g}"]) for g in (0, 1))
                and "pool taken" in logs["owner"].read_text()
            )

        await until(both_hold_a_queue, 60, "each scheduler to hold a queue")
        moved = taken_partitions(logs["gm1"])
        assert len(moved) == 1
        queue = moved[0]  # tenant `queue` goes through partition `queue`
        other = 1 - queue

        async def accepted_count() -> int:
            return len({v["task"] for _, v in await verdicts(bootstrap) if v["accepted"]})

        # wave 1: decided and answered while everyone is up
        await produce(bootstrap, tasks(queue, 0, WAVE) + tasks(other, 100, WAVE))

        async def wave_1_done() -> bool:
            return await accepted_count() == 2 * WAVE

        await until(wave_1_done, 60, "wave 1 accepted")
        # wave 2: launched while the owner is frozen, so unanswered when gm1 dies
        owner.send_signal(signal.SIGSTOP)
        try:
            await produce(bootstrap, tasks(queue, 200, WAVE) + tasks(other, 300, WAVE))

            async def wave_2_launched() -> bool:
                sent = {v["task"]["task"] for _, v in await launches(bootstrap, POOLS)}
                return len(sent) == 4 * WAVE

            await until(wave_2_launched, 20, "wave 2 launched")
            killed_at = time.time()
            gms[1].send_signal(signal.SIGKILL)
            gms[1].wait()
            # wave 3: the moved queue's requests wait for the survivor
            await produce(bootstrap, tasks(queue, 400, WAVE) + tasks(other, 500, WAVE))

            async def survivor_waits_for_the_moved_wave() -> bool:
                if taken_partitions(logs["gm0"]) != [0, 1]:
                    return False
                waiting = re.findall(
                    r"request waits for its launch's verdict.*?task=(\d+)",
                    logs["gm0"].read_text(),
                )
                return len({int(t) for t in waiting} & moved_wave_2) == WAVE

            # the owner stays frozen until the survivor has taken the queue over and read
            # the dead scheduler's wave-2 requests again: their launches are unanswered
            # then, and must be waited for (resumed as soon as the takeover was logged, the
            # owner's verdicts could come before the survivor read the queue)
            moved_wave_2 = {t.task_id for t in tasks(queue, 200, WAVE)}
            await until(survivor_waits_for_the_moved_wave, 30, "the survivor to take the queue")
        finally:
            owner.send_signal(signal.SIGCONT)

        async def wave_3_done() -> bool:
            return await accepted_count() == 6 * WAVE

        await until(wave_3_done, 60, "wave 3 accepted by the survivor")
        gms[1] = scheduler(1, "gm1-again")  # the same index again: its launch seqs must go on
        processes.append(gms[1])

        async def restarted_holds_a_queue() -> bool:
            return bool(taken_partitions(logs["gm1-again"]))

        await until(restarted_holds_a_queue, 60, "the restarted scheduler to hold a queue")
        await produce(bootstrap, tasks(queue, 600, WAVE) + tasks(other, 700, WAVE))

        async def wave_4_done() -> bool:
            return await accepted_count() == 8 * WAVE

        await until(wave_4_done, 60, "wave 4 accepted")
    finally:
        stop_all(processes)
    answered = await verdicts(bootstrap)
    sent = await launches(bootstrap, POOLS)
    # no launch id is sent twice: the survivor waited for the unanswered ones
    ids = Counter((v["task"]["task"], v["attempt"]) for _, v in sent)
    assert max(ids.values()) == 1, [i for i, n in ids.items() if n > 1]
    # every request: exactly one accepted launch, once duplicate ids are dropped
    accepted: dict[int, set[tuple[int, int, int]]] = defaultdict(set)
    for _, v in answered:
        if v["accepted"]:
            accepted[v["task"]].add((v["attempt"], v["pool"], v["host"]))
    expected = {t.task_id for w in range(8) for t in tasks(0, 100 * w, WAVE)}
    assert set(accepted) == expected
    assert all(len(launch) == 1 for launch in accepted.values())
    # no host over capacity (one slot each)
    holders = Counter(next(iter(launch))[1:] for launch in accepted.values())
    assert max(holders.values()) == 1
    # nothing refused for good: a restarted scheduler's seqs go on from its last
    finals = [v for _, v in answered if not v["accepted"] and v["final"]]
    assert not finals, finals[:3]
    # the survivor read the moved queue's wave 2 again and launched none of it twice
    stopping = logs["gm0"].read_text().split("scheduler stopping")[-1].splitlines()[0]
    replayed = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", stopping)}
    # the owner was frozen through the takeover: the moved queue's 20 wave-2 requests
    # (and the survivor's own 20, its queue taken again) had launches unanswered, which
    # it waited for; none was decided a second time
    assert replayed["launch_unanswered"] >= WAVE, replayed
    assert replayed["decided_again"] == 0, replayed
    restarted_seqs = sorted(
        v["seq"] for t, v in sent if v["gm"] == 1 and t > killed_at and v["task"]["task"] >= 600
    )
    first_seqs = sorted(v["seq"] for t, v in sent if v["gm"] == 1 and t < killed_at)
    assert restarted_seqs and first_seqs and restarted_seqs[0] > first_seqs[-1]
    survivor = sorted(
        t for t, v in sent if v["gm"] == 0 and v["task"]["tenant"] == queue and t > killed_at
    )
    sys.stdout.write(
        f"\nscheduler kill -9 -> survivor's first launch for the moved queue {queue}: "
        f"{survivor[0] - killed_at:.2f} s; survivor replayed {replayed}\n"
    )
