"""Federated scale-out after Megha (Thinakaran et al.): pool owners and global schedulers.

One concept a module:

* ``trace``: the Megha/Eagle job trace (arrival, tasks, durations), read with bounds;
* ``topology``: pools of hosts, each pool cut into one partition per global scheduler;
* ``messages``: tasks, launch and preemption requests, pool summaries, verdicts;
* ``owner``: a pool owner (Megha's Local Master), the only holder of a pool's true
  state, which validates every launch and preemption;
* ``view``: a global scheduler's eventually consistent view, built from summaries;
* ``matching``: Algorithm 1, the first host of a partition that fits a task;
* ``fairness``: Algorithm 2's share accounting and choice of whom to preempt;
* ``scheduler``: a global scheduler (Megha's Global Master): tenant queues, internal
  partitions, repartitioning, preemption;
* ``timing``: the event-time cost model (network delay, processing costs);
* ``allocation``: allocation time and its section III components;
* ``simulator``: the event-time replay of a federation (Megha, centralized);
* ``sparrow``: the random-probing baseline (2 probes per task, late binding);
* ``summary_codec``: summaries as versioned data-only JSON;
* ``state_topic``: the live state topic (owners publish, a scheduler's view reads);
* ``live_wire``: the live records (requests, launches, verdicts, owner snapshots);
* ``request_ledger``: which launch of each request is unanswered, which requests are
  final, and the offset a scheduler may commit (restart safety);
* ``launch_backlog``: the launches since the owners' committed offsets (a takeover);
* ``running_tasks``: every pool's running tasks as the verdicts tell them (Algorithm 2
  live);
* ``live_clients``: the Kafka clients the processes share;
* ``live_allocation``: a live scheduler's allocation time as Prometheus histograms;
* ``live_owner``, ``live_scheduler``: the owner and scheduler processes over Kafka;
* ``settings``, ``cli``: the federation's configuration file and `lavad federation`.

The modules up to ``summary_codec`` are a core: no clock, no I/O, seeded randomness
only, nothing of lavad imported; the live ones bring the Kafka clients (lavad.daemon).
"""
