"""Pool owners' snapshots on the owner-snapshots topic, in chunks a broker accepts.

A large pool's snapshot (its running tasks and the launch ids it has decided) can be
larger than a broker's ``message.max.bytes`` (1 MB by default), and one record that
size would be refused and stop its owner at every restart. So a snapshot is written
as chunks of at most ``CHUNK_BYTES``, then a manifest naming them (count, size and
SHA-256 of the whole), then tombstones for the previous snapshot's chunks: at every
moment the newest manifest names chunks that exist. Keys:
``pool-<p>`` for the manifest (one per pool survives compaction) and
``pool-<p>/<snapshot id>/<chunk>`` for the chunks.

Reading assembles each pool's newest manifest from its chunks. A manifest whose chunks
are missing or do not add up (torn, or overwritten), and any record that is none of
these, is refused with the reason: the pool is then rebuilt from its launches, never
restored from half a snapshot.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Final

import orjson

MANIFEST_FORMAT: Final = "lavad.owner-snapshot"
MANIFEST_VERSION: Final = 1
# Half a broker's default message.max.bytes: room for the record's own overhead.
CHUNK_BYTES: Final = 512 * 1024
# A snapshot of more chunks than this (2 GiB at the default size) is not one.
MAX_CHUNKS: Final = 4096
_MANIFEST_KEY: Final = re.compile(r"pool-(\d{1,9})")
_CHUNK_KEY: Final = re.compile(r"pool-(\d{1,9})/([0-9a-f]{1,64})/(\d{1,9})")


def manifest_key(pool: int) -> bytes:
    return f"pool-{pool}".encode()


def chunk_key(pool: int, snapshot_id: str, chunk: int) -> bytes:
    return f"pool-{pool}/{snapshot_id}/{chunk}".encode()


@dataclass(frozen=True, slots=True)
class Manifest:
    pool: int
    snapshot_id: str
    chunks: int
    size: int
    sha256: str


def snapshot_records(
    pool: int, body: bytes, chunk_bytes: int = CHUNK_BYTES
) -> tuple[Manifest, list[tuple[bytes, bytes]], tuple[bytes, bytes]]:
    """The manifest, the chunk records (key, value) and the manifest record of ``body``.

    The snapshot's id is its content's digest, so the same snapshot written twice
    (a pool given up, then taken back with no launch between) has the same keys."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes: want >= 1, got {chunk_bytes}")
    digest = hashlib.sha256(body).hexdigest()
    count = max(1, -(-len(body) // chunk_bytes))
    if count > MAX_CHUNKS:
        raise ValueError(f"a snapshot of {len(body)} bytes needs more than {MAX_CHUNKS} chunks")
    manifest = Manifest(pool, digest[:32], count, len(body), digest)
    chunks = [
        (chunk_key(pool, manifest.snapshot_id, i), body[i * chunk_bytes : (i + 1) * chunk_bytes])
        for i in range(count)
    ]
    value = orjson.dumps(
        {
            "format": MANIFEST_FORMAT,
            "v": MANIFEST_VERSION,
            "pool": pool,
            "id": manifest.snapshot_id,
            "chunks": count,
            "bytes": len(body),
            "sha256": digest,
        }
    )
    return manifest, chunks, (manifest_key(pool), value)


def _manifest(pool: int, value: bytes) -> Manifest | str:
    """The manifest ``value`` holds, or the reason it is not one."""
    try:
        raw = orjson.loads(value)
    except orjson.JSONDecodeError:
        return "manifest: not JSON"
    if not isinstance(raw, dict) or raw.get("format") != MANIFEST_FORMAT:
        return "manifest: not an owner snapshot's manifest"
    if raw.get("v") != MANIFEST_VERSION or type(raw.get("v")) is not int:
        return f"manifest: version {str(raw.get('v'))[:20]}, this lavad reads {MANIFEST_VERSION}"
    snapshot_id, chunks, size, digest = (raw.get(k) for k in ("id", "chunks", "bytes", "sha256"))
    if (
        raw.get("pool") != pool
        or not isinstance(snapshot_id, str)
        or _CHUNK_KEY.fullmatch(f"pool-{pool}/{snapshot_id}/0") is None
        or type(chunks) is not int
        or not 1 <= chunks <= MAX_CHUNKS
        or type(size) is not int
        or size < 0
        or not isinstance(digest, str)
    ):
        return "manifest: a field is missing or out of range"
    return Manifest(pool, snapshot_id, chunks, size, digest)


@dataclass(slots=True)
class SnapshotReader:
    """Reads the owner-snapshots topic in offset order and assembles each pool's newest
    complete snapshot. Refused records and manifests are kept with their reasons."""

    manifests: dict[int, Manifest] = field(default_factory=dict)
    chunks: dict[bytes, bytes] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)

    def add(self, key: bytes | None, value: bytes | None) -> None:
        text = key.decode("utf-8", "replace") if key is not None else ""
        if (found := _MANIFEST_KEY.fullmatch(text)) is not None:
            pool = int(found.group(1))
            if value is None:
                self.manifests.pop(pool, None)
                return
            manifest = _manifest(pool, value)
            if isinstance(manifest, str):
                self.refused.append(f"pool {pool}: {manifest}")
            else:
                self.manifests[pool] = manifest
        elif _CHUNK_KEY.fullmatch(text) is not None and key is not None:
            if value is None:
                self.chunks.pop(key, None)
            else:
                self.chunks[key] = value
        else:
            self.refused.append(f"record with key {text[:80]!r}: not an owner snapshot's")

    def snapshots(self) -> dict[int, bytes]:
        """Each pool's newest snapshot whose chunks are all there and add up."""
        found: dict[int, bytes] = {}
        for pool, manifest in self.manifests.items():
            parts = [
                self.chunks.get(chunk_key(pool, manifest.snapshot_id, i))
                for i in range(manifest.chunks)
            ]
            missing = sum(part is None for part in parts)
            if missing:
                self.refused.append(f"pool {pool}: {missing} of {manifest.chunks} chunks missing")
                continue
            body = b"".join(part for part in parts if part is not None)
            if len(body) != manifest.size or hashlib.sha256(body).hexdigest() != manifest.sha256:
                self.refused.append(f"pool {pool}: chunks do not add up to the manifest's")
                continue
            found[pool] = body
        return found
