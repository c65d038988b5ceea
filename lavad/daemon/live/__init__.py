"""The live shell: Kafka in, the engine, decisions out.

- ``shell.py``: ``LiveDaemon``, the consume -> decide -> publish (acks=all)
  -> commit loop (deciding goes on while a publish is awaited), the broker
  probe, housekeeping and shutdown; it composes:
- ``intake.py``: records to events (decode, route by pool), the engine, dead
  letters after the decisions the timers made, the watermark's timers;
- ``publisher.py``: acks=all batches per topic and partition, re-sends,
  transactions;
- ``partitions.py``: taking, restoring (or rebuilding) and releasing
  partitions; snapshots only while everything is published;
- ``retry.py``: the one backoff every retry uses.
- ``snapshots.py`` and ``state_codec.py``: versioned per-partition state with
  the offsets it reflects, written as data (JSON and raw arrays), never code.
- ``watermark.py``: event-time watermark for the engine's timers.
- ``telemetry.py`` and ``http.py``: Prometheus metrics, /healthz, /readyz;
  ``lag_watch.py``: the falling-behind watch (lag growing while ready).
- ``connection.py``: aiokafka clients from ``[kafka]`` settings.
- ``parsed_records.py``: the input consumer hands over aiokafka's parsed
  records instead of building a ``ConsumerRecord`` per record.
- ``cli.py`` and ``demo.py``: ``lavad run``, ``lavad produce``, ``lavad demo``.

Why aiokafka directly and not faust-streaming: lavad's state per pool is
numpy arrays plus seeded generators that must be restored exactly and move
with a partition as one unit. Faust tables are key-value stores replicated
through a changelog topic, one record per key change; at tens of thousands
of placements a second that is a changelog write per event, and a pool's
arrays do not split into keys. A snapshot of the whole partition plus the
input offsets it reflects gives the same "state follows the partition" with
one write per interval. Faust stays the designated engine for multi-worker
stream jobs whose state is naturally keyed (per-deployment counters, say).
"""
