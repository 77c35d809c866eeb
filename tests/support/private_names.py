"""Every private name of Faust, mode and aiokafka that service/stream/framework.py uses, as
(owner, private name, why): what tests/unit/test_framework.py checks on the pinned versions. Names
set in an owner's __init__ (instance attributes) are looked for there."""

from __future__ import annotations

from typing import Any

import faust
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.producer.sender import Sender
from faust.transport.drivers import aiokafka as aiokafka_driver

PRIVATE_NAMES: list[tuple[Any, str, str]] = [
    (faust.Stream, "_active_agens", "LeanStream: its take loop is closed at the stream's stop"),
    (faust.Stream, "_enable_passive", "LeanStream: the take loop reads the channel passively, as Faust's"),
    (faust.Stream, "_processors", "LeanStream: the take loop's processor is removed when it ends"),
    (aiokafka_driver.AIOKafkaConsumerThread, "_create_worker_consumer", "app_class: the fetch wait"),
    (aiokafka_driver.Consumer, "_new_consumer_thread", "app_class: the consumer thread with that wait"),
    (faust.App, "_new_transport", "app_class: the transport with that consumer"),
    (faust.App, "_on_agent_error", "app_class: an agent that raises stops the worker"),
    (faust.App, "_consumer_wait_empty", "app_class: a worker stopping for a failure does not wait"),
    (aiokafka_driver.Consumer, "_stopped", "app_class: what wait_first checks before it reports"),
    (aiokafka_driver.Consumer, "_crashed", "app_class: what wait_first checks before it reports"),
    (aiokafka_driver.Consumer, "wait_first", "app_class: the stream callback run inline"),
    (AIOKafkaConsumer, "_fetch_max_wait_ms", "app_class: read when the consumer starts its fetcher"),
    (AIOKafkaConsumer, "_fetch_min_bytes", "app_class: read when the consumer starts its fetcher"),
    (AIOKafkaConsumer, "_isolation_level", "app_class: read when the consumer starts its fetcher"),
    (aiokafka_driver.Consumer, "_committed_offset", "committed_offset"),
    (aiokafka_driver.Consumer, "_commit", "app_class: under exactly-once the transactions commit"),
    (aiokafka_driver.Consumer, "_add_gap", "allow_commits_past"),
    (aiokafka_driver.AIOKafkaConsumerThread, "_consumer", "fetch_state: the consumer, if it runs"),
    (aiokafka_driver.Consumer, "_thread", "fetch_state: the consumer thread"),
    (aiokafka_driver.Consumer, "_read_offset", "fetch_state: the last offset handed to a stream"),
    (AIOKafkaConsumer, "_subscription", "fetch_state: the position, without a request"),
    (aiokafka_driver.Producer, "_ensure_producer", "aiokafka_producer"),
    (AIOKafkaProducer, "_partitioner", "default_partitions"),
    (AIOKafkaProducer, "_metadata", "default_partitions"),
    (AIOKafkaProducer, "_partition", "default_partitions"),
    (AIOKafkaProducer, "_sender", "coordinator_lookups_retried"),
    (Sender, "_find_coordinator", "coordinator_lookups_retried"),
    (Sender, "_retry_backoff", "coordinator_lookups_retried"),
]
