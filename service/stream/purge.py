"""The signatures topic purged of what is decided: an internal topic, as a Kafka Streams repartition
topic is, kept with no time or size retention and cut with delete-records instead."""

from __future__ import annotations

import logging

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

from ..config import Settings
from .metrics import Metrics
from .topics import admin_client

log = logging.getLogger("neardup.purge")


class SignaturesPurge:
    """Deletes the shard's signatures messages below the index stage's committed offset: those
    decided, their verdicts, feed records and changelog records acknowledged by the broker
    (pipeline/delivery.py acknowledges nothing before that), so neither a restart nor a rebuild reads them
    again. The admin client is started at the first purge and kept (one connection, every interval)."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.purged = 0  # the log start offset the last purge set
        self._admin: AIOKafkaAdminClient | None = None

    async def purge(self, committed: int | None) -> None:
        """Up to `committed` (the next offset the group reads; None: nothing committed yet). A purge
        that fails is logged and tried again at the next interval: it only frees disk."""
        if committed is None or committed <= self.purged:
            return
        tp = TopicPartition(self.settings.signatures_topic, 0)
        try:
            if self._admin is None:
                admin = admin_client(self.settings)
                await admin.start()
                self._admin = admin
            low = await self._admin.delete_records({tp: RecordsToDelete(committed)})
        except Exception as exc:
            log.warning("signatures_purge_failed topic=%s before=%d error=%r", tp.topic, committed, exc)
            await self.close()  # a new client next time: this one's connections may be stale
            return
        self.purged = low.get(tp, committed)
        self.metrics.signatures_purged.set(self.purged)
        log.info("signatures_purged topic=%s log_start=%d", tp.topic, self.purged)

    async def close(self) -> None:
        if self._admin is not None:
            admin, self._admin = self._admin, None
            await admin.close()
