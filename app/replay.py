"""``seam dlq replay``: dead letters sent back to the input topic, as they were, once.

A dead letter keeps its record's key, value and headers (:func:`agents.formats.codec.dead_letter`). A record refused
for a reason that passes (the schema registry was down: ``registry_unavailable``; the model failed on it:
``inference_error``) is scored once it is sent again. :func:`replay` reads the dead-letter topic up to its
end as of the start, picks the letters of the chosen reasons, sends each one's original record to the input
topic (acks=all, idempotent, in the dead letters' order; its partition follows from its key as Kafka's
producer picks it) with the header ``seam-replayed-from`` = ``<dlq topic>/<partition>/<offset>``, and only
then records how far it read, per reason, in the consumer group ``<app id>-dlq-replay-<reason>``. So a
later run for a reason sends only the letters that arrived since; ``again`` sends the earlier ones too, and
an offset range picks letters by their dead-letter offsets without reading or recording progress.

A run stopped between sending and recording sends those letters again the next time: a worker scores a
redelivered id with the features it had, and readers de-duplicate predictions by id. A replayed record is an
event like any other: if its partition's watermark has passed it by more than the allowed lateness, it
goes to the late topic. A letter whose key, value or headers were cut to fit is not sent (counted apart):
its original stays at the source topic, partition and offset the letter names.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from agents.formats.codec import Original, original_of
from tables.kafka import Connection, assign_all, client_options

__all__ = ["REPLAYED_FROM", "ReplayReport", "replay"]

REPLAYED_FROM = "seam-replayed-from"  # the header a replayed record carries: where its dead letter was


@dataclass(slots=True)
class ReplayReport:
    """What a replay did: records sent, by reason; letters it could not send whole, by what was cut."""

    sent: Counter[str] = field(default_factory=Counter)  # (or chosen to be, in a dry run)
    not_whole: Counter[str] = field(default_factory=Counter)
    read: int = 0  # dead letters read (of any reason)

    def line(self, dlq_topic: str, input_topic: str, dry_run: bool = False) -> str:
        verb = "would replay" if dry_run else "replayed"
        by_reason = ", ".join(f"{reason}: {count}" for reason, count in sorted(self.sent.items())) or "none"
        text = f"{verb} {sum(self.sent.values())} dead letters ({by_reason}) from {dlq_topic!r} to {input_topic!r}"
        if self.not_whole:
            cut = ", ".join(f"{what}: {count}" for what, count in sorted(self.not_whole.items()))
            text += f"; {sum(self.not_whole.values())} not sent, their original was cut to fit ({cut})"
        return text + f"; {self.read} dead letters read"


def ledger_group(app_id: str, reason: str) -> str:
    """The consumer group in which replays of ``reason`` record how far they have read."""
    return f"{app_id}-dlq-replay-{reason}"


async def replay(bootstrap: str | Connection, dlq_topic: str, input_topic: str, app_id: str, reasons: Sequence[str], *,
                 offsets: tuple[int, int] | None = None, again: bool = False, dry_run: bool = False) -> ReplayReport:
    """Send the dead letters of ``reasons`` back to ``input_topic`` (see the module); ``offsets``: only the
    letters at dead-letter offsets ``first..last`` (inclusive), whatever earlier runs sent."""
    reader = AIOKafkaConsumer(**client_options(bootstrap), enable_auto_commit=False)
    ledgers = {reason: AIOKafkaConsumer(**client_options(bootstrap), group_id=ledger_group(app_id, reason),
                                        enable_auto_commit=False) for reason in reasons}
    producer = AIOKafkaProducer(**client_options(bootstrap), acks="all", enable_idempotence=True)
    report = ReplayReport()
    await reader.start()
    try:
        for ledger in ledgers.values():
            await ledger.start()
        tps = await assign_all(reader, bootstrap, [dlq_topic], from_end=False)  # LookupError: no such topic
        ends = await reader.end_offsets(tps)
        beginnings = await reader.beginning_offsets(tps)
        starts: dict[str, dict[TopicPartition, int]] = {}
        for reason, ledger in ledgers.items():
            ledger.assign(tps)
            starts[reason] = {}
            for tp in tps:
                recorded = None if again or offsets is not None else await ledger.committed(tp)
                starts[reason][tp] = max(beginnings[tp], offsets[0] if offsets else recorded or 0)
        chosen: list[tuple[TopicPartition, int, str, Original]] = []
        for tp in tps:
            end = ends[tp] if offsets is None else min(ends[tp], offsets[1] + 1)
            start = min(starts[reason][tp] for reason in reasons)
            if start >= end:
                continue
            reader.seek(tp, start)
            while (await reader.position(tp)) < end:
                for record in (await reader.getmany(tp, timeout_ms=1000, max_records=500)).get(tp, []):
                    if record.offset >= end:
                        break
                    report.read += 1
                    letter = orjson.loads(record.value) if record.value else {}
                    why = letter.get("reason") if isinstance(letter, dict) else None
                    if not isinstance(why, str) or why not in starts or record.offset < starts[why][tp]:
                        continue
                    original = original_of(letter)
                    if isinstance(original, str):
                        report.not_whole[original] += 1
                    else:
                        chosen.append((tp, record.offset, why, original))
                        report.sent[why] += 1  # (a failed send raises: no report)
        if not dry_run:
            await producer.start()
            try:
                deliveries = []
                for tp, offset, _, original in chosen:
                    headers = [*original.headers, (REPLAYED_FROM, f"{tp.topic}/{tp.partition}/{offset}".encode())]
                    deliveries.append(await producer.send(input_topic, original.value, key=original.key,
                                                          headers=headers))
                for delivery in deliveries:
                    await delivery
            finally:
                await producer.stop()
            if offsets is None:  # only now: what was read is sent
                for ledger in ledgers.values():
                    await ledger.commit({tp: ends[tp] for tp in tps})
    finally:
        await reader.stop()
        for ledger in ledgers.values():
            await ledger.stop()
    return report
