"""What ``pgstore.appends`` and ``pgstore.pending_appends`` share: one
queued append (``Item``) and the fence's miss (``FenceMiss``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tablets import batch as batch_header
from tablets.errors import StorageError
from tablets.seam import AppendResult, BlobSink

if TYPE_CHECKING:
    from tablets.tablet_settings import TabletSettings


class FenceMiss(StorageError):
    """The partition row was not at this leader's epoch and log end: an
    earlier change did not land, or another gateway claimed the partition.
    Answered once the row is reread (``NotLeader``, or retriable)."""


@dataclass(slots=True)
class Item:
    checked: asyncio.Future[int]  # the records' max timestamp, once checked
    appended: asyncio.Future[AppendResult]
    view: memoryview
    header: batch_header.BatchHeader
    settings: TabletSettings
    now_ms: int
    sink: BlobSink | None  # a transactional batch's transaction
    base: int = -1  # the offset last assigned
    reassigned: int = 0  # times assigned again after the fence refused it
