"""The ACLs seam needs on a secured cluster, for two principals: the workers and the operator.

``seam acls`` prints them as Kafka's own ``kafka-acls`` commands for the settings' app id and topics.
Nothing else is granted: every other principal can read and write none of seam's topics, and only the
operator may write the control topic (which deploys models).

* **worker** (every replica): reads the input, writes the outputs, follows the control topic (reads
  only); its consumer group; its changelogs and Faust's own topics (all named ``<app id>-...``); under
  exactly once its transactional ids (``<app id>-<input topic>-<partition>``). It declares its topics
  when it starts, so it may also create them (a cluster whose topics are made beforehand can drop
  ``Create``).
* **operator** (``seam model``, ``seam dlq replay``): reads and writes the control topic; reads the
  dead letters and writes them back to the input, keeping its progress in the groups
  ``<app id>-dlq-replay-<reason>``.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from app.settings import Settings

__all__ = ["Acl", "acls", "commands"]


@dataclass(frozen=True, slots=True)
class Acl:
    """Allow ``principal`` these operations on one resource (``pattern``: literal or prefixed)."""

    principal: str
    resource: str  # topic, group, transactional-id, cluster
    name: str
    operations: tuple[str, ...]
    pattern: str = "literal"

    def args(self) -> list[str]:
        """The ``kafka-acls`` arguments that add it."""
        args = ["--add", "--allow-principal", self.principal]
        for operation in self.operations:
            args += ["--operation", operation]
        if self.resource == "cluster":
            return [*args, "--cluster"]
        args += [f"--{self.resource}", self.name]
        return [*args, "--resource-pattern-type", self.pattern] if self.pattern != "literal" else args


def acls(settings: Settings, *, worker: str, operator: str) -> list[Acl]:
    """Every ACL seam's workers (principal ``worker``) and its operator (``operator``) need, and no more."""
    app_id = settings.app_id
    outputs = [settings.predictions_topic, settings.dlq_topic, settings.late_topic, settings.shadow_topic,
               *([settings.feature_log_topic] if settings.feature_log_topic else [])]
    declared = ("Describe", "Create")
    return [
        Acl(worker, "topic", settings.input_topic, ("Read", *declared)),
        *(Acl(worker, "topic", topic, ("Write", *declared)) for topic in outputs),
        Acl(worker, "topic", settings.model_control_topic, ("Read", *declared)),
        Acl(worker, "topic", f"{app_id}-", ("Read", "Write", *declared), "prefixed"),  # changelogs, Faust's own
        Acl(worker, "group", app_id, ("Read", "Describe")),
        Acl(worker, "transactional-id", f"{app_id}-{settings.input_topic}-", ("Write", "Describe"), "prefixed"),
        Acl(worker, "cluster", "kafka-cluster", ("IdempotentWrite",)),
        Acl(operator, "topic", settings.model_control_topic, ("Read", "Write", *declared)),
        Acl(operator, "topic", settings.dlq_topic, ("Read", "Describe")),
        Acl(operator, "topic", settings.input_topic, ("Write", "Describe")),
        Acl(operator, "group", f"{app_id}-dlq-replay-", ("Read", "Describe"), "prefixed"),
        Acl(operator, "cluster", "kafka-cluster", ("IdempotentWrite",)),
    ]


def commands(settings: Settings, *, worker: str, operator: str, command_config: str = "admin.properties") -> list[str]:
    """``acls`` as ``kafka-acls`` command lines, run as a principal allowed to alter ACLs."""
    server = settings.broker_bootstrap.split(",")[0]
    return [shlex.join(["kafka-acls", "--bootstrap-server", server, "--command-config", command_config, *acl.args()])
            for acl in acls(settings, worker=worker, operator=operator)]
