"""The ACLs seam needs on a secured cluster, for two principals: the workers and the operator.

``seam acls`` prints them as Kafka's own ``kafka-acls`` commands for the settings' app id and topics, as few
as say exactly them: one command grants its principals each of its operations on each of its resources (the
cross product ``kafka-acls`` makes of repeated ``--allow-principal``, ``--operation`` and ``--topic`` options),
so ACLs are grouped only where that product is theirs and nothing more.
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

__all__ = ["Acl", "Grant", "acls", "commands", "grants"]


@dataclass(frozen=True, slots=True)
class Acl:
    """Allow ``principal`` these operations on one resource (``pattern``: literal or prefixed)."""

    principal: str
    resource: str  # topic, group, transactional-id, cluster
    name: str
    operations: tuple[str, ...]
    pattern: str = "literal"


@dataclass(frozen=True, slots=True)
class Grant:
    """One ``kafka-acls --add``: each principal may do each operation on each named resource of one type."""

    principals: tuple[str, ...]
    resource: str
    names: tuple[str, ...]
    operations: tuple[str, ...]
    pattern: str = "literal"

    def acls(self) -> list[Acl]:
        """The ACLs it adds, one per principal and resource."""
        return [Acl(principal, self.resource, name, self.operations, self.pattern)
                for principal in self.principals for name in self.names]

    def args(self) -> list[str]:
        """The ``kafka-acls`` arguments that add it."""
        args = ["--add"]
        for principal in self.principals:
            args += ["--allow-principal", principal]
        for operation in self.operations:
            args += ["--operation", operation]
        if self.resource == "cluster":
            return [*args, "--cluster"]
        for name in self.names:
            args += [f"--{self.resource}", name]
        return [*args, "--resource-pattern-type", self.pattern] if self.pattern != "literal" else args


def grants(granted: list[Acl]) -> list[Grant]:
    """``granted`` as few grants as add exactly it: the names one principal gets the same operations on, then
    the principals that get the same operations on the same names."""
    names: dict[tuple[str, str, tuple[str, ...], str], dict[str, None]] = {}
    for acl in granted:
        names.setdefault((acl.principal, acl.resource, acl.operations, acl.pattern), {})[acl.name] = None
    principals: dict[tuple[str, tuple[str, ...], tuple[str, ...], str], list[str]] = {}
    for (principal, resource, operations, pattern), named in names.items():
        principals.setdefault((resource, tuple(named), operations, pattern), []).append(principal)
    return [Grant(tuple(who), resource, named, operations, pattern)
            for (resource, named, operations, pattern), who in principals.items()]


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
    """``acls`` as ``kafka-acls`` command lines (see :func:`grants`), run as a principal allowed to alter ACLs."""
    server = settings.broker_bootstrap.split(",")[0]
    return [shlex.join(["kafka-acls", "--bootstrap-server", server, "--command-config", command_config,
                        *grant.args()]) for grant in grants(acls(settings, worker=worker, operator=operator))]
