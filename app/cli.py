"""seam's own commands beside Faust's (``seam produce``, ``seam bench``, ``seam model``, ``seam dlq``, ``seam spec``),
added to an app by :func:`register`."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import faust
import orjson
from faust.cli import AppCommand, argument, option
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from agents.formats.avro import input_writer
from agents.model import control
from agents.model.deployment import (
    Deployment,
    DeploymentError,
    ModelRef,
    deploy,
    initial,
    promote,
    rollback,
    set_shadow,
)
from app.loadgen import produce
from app.settings import Settings
from app.synthetic import generator_for
from app.topics import ensure_topics
from tables.kafka import REFUSALS, Refused, check, refused
from tables.spec import SpecError, load_spec
from tables.spec import describe as describe_spec

if TYPE_CHECKING:
    from agents.model.runtime import ModelFiles

__all__ = ["register"]


def register(app: faust.App, settings: Settings) -> None:
    """Add ``seam produce``, ``bench``, ``model``, ``dlq`` and ``spec`` to ``app``'s command line."""

    @app.command(
        option("--rate", type=float, default=1000.0, show_default=True, help="Records per second."),
        option("--duration", type=float, default=30.0, show_default=True, help="Seconds to produce for."),
        option("--keys", "--cards", "keys", type=int, default=1000, show_default=True,
               help="Distinct keys (cards, devices)."),
        option("--seed", type=int, default=None, help="Random seed (default: time based)."),
        option("--topic", default=None, help="Topic (default: SEAM_INPUT_TOPIC)."),
        option("--late-rate", type=float, default=0.001, show_default=True,
               help="Share of events that arrive minutes late."),
        option("--start-ms", type=int, default=None,
               help="Event time of the first record (default: early enough that the last is no later than "
                    "now). Synthetic event time runs far ahead of the wall clock: a start after now makes records "
                    "that a worker refuses as future_timestamp (SEAM_MAX_FUTURE_S)."),
        name="produce",
    )
    async def produce_command(
        self: AppCommand, rate: float, duration: float, keys: int, seed: int | None,
        topic: str | None, late_rate: float, start_ms: int | None,
    ) -> None:
        """Produce the example stream of SEAM_FEATURE_SPEC (fraud or sensors) at a fixed rate (open loop), in
        SEAM_INPUT_FORMAT."""
        seed = int(time.time()) if seed is None else seed
        spec = load_spec(settings.feature_spec)
        try:
            generator = generator_for(spec, keys=keys, seed=seed, id_prefix=f"e{seed}", start_ms=start_ms,
                                      late_rate=late_rate, end_ms=int(time.time() * 1000) if start_ms is None else None,
                                      events=int(rate * duration))
        except LookupError as exc:
            raise SystemExit(f"seam produce: {exc}") from None
        target = topic or settings.input_topic
        encode: Callable[[dict[str, Any]], bytes] = orjson.dumps
        if settings.input_format == "avro":  # the spec's input schema, registered as <topic>-value
            encode = await input_writer(settings.schema_registry_url, f"{target}-value", spec)
        columns = (TextColumn("producing"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        with Progress(*columns) as progress:
            task = progress.add_task("produce", total=int(rate * duration))
            report = await produce(
                settings.kafka, target, rate=rate, duration_s=duration, generator=generator,
                key_field=spec.key, partitions=settings.topic_partitions, encode=encode,
                on_progress=lambda done, _total: progress.update(task, completed=done))
        self.say(f"sent {report.sent} {spec.name} records ({report.positive} labelled positive) to {target!r} "
                 f"in {report.elapsed_s:.1f}s ({report.rate:.0f}/s); last event time {generator.last_ts_ms}")


    @app.command(
        option("--quick", is_flag=True, default=False, help="Small and short: checks the harness, not speed."),
        option("--out", default=None, help="Folder for the JSON results and the plots (default: .data/bench)."),
        option("--write", default=None, help="Replace the 'End to end' section of this Markdown file."),
        option("--models", default=None, help="Comma separated: default, bench."),
        option("--modes", default=None, help="Comma separated subset of the modes (default: all)."),
        name="bench",
    )
    async def bench_command(
        self: AppCommand, quick: bool, out: str | None, write: str | None, models: str | None, modes: str | None,
    ) -> None:
        """Benchmark seam against its baselines and ceilings on the configured broker (see docs/BENCHMARKS.md)."""
        try:
            from bench import cli as bench_cli
        except ImportError as exc:  # an install without the benchmark package or its extra
            raise SystemExit(f"seam bench needs the source checkout with the bench extra installed: {exc}") from None
        argv = ["--bootstrap", settings.broker_bootstrap, *(["--quick"] if quick else [])]
        for name, value in (("--out", out), ("--write", write), ("--models", models), ("--modes", modes)):
            argv += [name, value] if value else []
        args = bench_cli.build_parser().parse_args(argv)
        await bench_cli.run(args, "seam bench " + " ".join(argv[2:]), settings.broker_bootstrap)


    # Faust's own `faust model NAME` (the fields of a faust.Record) means nothing to seam, whose records
    # are not Faust models: `seam model` is the model deployment command.
    import faust.cli.faust  # noqa: F401 - registers Faust's commands, so the one replaced here is there
    from faust.cli.base import cli

    cli.commands.pop("model", None)

    @app.command(
        argument("action", type=click.Choice(MODEL_ACTIONS)),
        argument("path", required=False),
        option("--canary", type=click.FloatRange(0, 100, min_open=True, max_open=True), default=None,
               help="deploy: score this percentage of the cards with PATH (a canary); the rest stay on the primary."),
        option("--shadow", "shadow", default=None,
               help="deploy: also score every row with this model off the critical path (its scores go to "
                    "SEAM_SHADOW_TOPIC)."),
        name="model",
    )
    async def model_command(self: AppCommand, action: str, path: str | None, canary: float | None,
                            shadow: str | None) -> None:
        """Deploy, promote, roll back or show the models every worker serves (the control topic's record).

        \b
        seam model deploy PATH [--canary PERCENT] [--shadow PATH]
        seam model promote           the canary becomes the primary
        seam model rollback          withdraw the canary, or go back to the previous primary
        seam model shadow PATH|off   start, replace or stop a shadow model
        seam model status            the deployment the workers converge on
        """
        from agents.model.runtime import ModelFileError, ModelFiles  # ONNX Runtime: only for the commands that need it

        bootstrap, topic = settings.kafka, settings.model_control_topic
        try:
            await check(bootstrap)
            await ensure_topics(bootstrap, [], 1, settings.topic_replication_factor, compacted=[topic])
        except (Refused, ConnectionError) as exc:
            raise SystemExit(f"seam model {action}: {exc}") from None

        def served_without_a_record() -> Deployment:
            return initial(ModelRef.of(settings.model_path))

        try:
            if action == "status":
                current = await control.read_latest(bootstrap, topic)
                deployment = current if current is not None else served_without_a_record()
                self.say(describe(deployment, source="control topic" if current is not None else "SEAM_MODEL_PATH"))
                return
            files = ModelFiles.under(settings.model_root, settings.model_path, max_bytes=settings.max_model_mb << 20)
            transition = _transition(action, path, canary, shadow, files)
            updated = await control.change(bootstrap, topic, served_without_a_record, transition)
        except (DeploymentError, ModelFileError, Refused) as exc:
            raise SystemExit(f"seam model {action}: {exc}") from None
        except REFUSALS as exc:  # the broker's answer to a write or read its ACLs do not allow
            refusal = refused(exc, bootstrap, f"the control topic {topic!r}")
            raise SystemExit(f"seam model {action}: {refusal}") from None
        self.say(describe(updated, source=f"written to {topic}"))

    @app.command(
        argument("action", type=click.Choice(DLQ_ACTIONS)),
        option("--reason", "reasons", multiple=True, required=True,
               help="Replay the dead letters of this reason (repeatable), e.g. registry_unavailable."),
        option("--from-offset", type=int, default=None, help="Only letters at this dead-letter offset or later."),
        option("--to-offset", type=int, default=None, help="Only letters at this dead-letter offset or earlier."),
        option("--again", is_flag=True, default=False, help="Also the letters earlier replays of the reason read."),
        option("--dry-run", is_flag=True, default=False, help="Say what would be replayed; send nothing."),
        name="dlq",
    )
    async def dlq_command(self: AppCommand, action: str, reasons: tuple[str, ...], from_offset: int | None,
                          to_offset: int | None, again: bool, dry_run: bool) -> None:
        """Send dead letters back to the input topic, as they were (key, value, headers), once.

        \b
        seam dlq replay --reason registry_unavailable      the letters since the last replay of that reason
        seam dlq replay --reason inference_error --from-offset 100 --to-offset 180
        """
        from app.replay import replay

        offsets = None
        if from_offset is not None or to_offset is not None:
            offsets = (from_offset or 0, to_offset if to_offset is not None else (1 << 63) - 2)
        try:
            report = await replay(settings.kafka, settings.dlq_topic, settings.input_topic,
                                  settings.app_id, reasons, offsets=offsets, again=again, dry_run=dry_run)
        except (LookupError, Refused) as exc:
            raise SystemExit(f"seam dlq {action}: {exc}") from None
        except REFUSALS as exc:
            raise SystemExit(f"seam dlq {action}: {refused(exc, settings.kafka, 'the replay')}") from None
        self.say(report.line(settings.dlq_topic, settings.input_topic, dry_run))

    @app.command(
        option("--worker", default="User:seam", show_default=True, help="The workers' principal."),
        option("--operator", default="User:operator", show_default=True,
               help="The principal that deploys models and replays dead letters."),
        option("--command-config", default="admin.properties", show_default=True,
               help="The client configuration of a principal allowed to alter ACLs."),
        name="acls",
    )
    async def acls_command(self: AppCommand, worker: str, operator: str, command_config: str) -> None:
        """Print the kafka-acls commands that grant seam's workers and operator what they need, and no more.

        \b
        seam acls --worker User:seam --operator User:operator | sh
        """
        from app.acls import commands

        for line in commands(settings, worker=worker, operator=operator, command_config=command_config):
            self.say(line)

    @app.command(
        argument("action", type=click.Choice(("check",))),
        argument("spec_path", metavar="SPEC"),
        argument("model_path", metavar="[MODEL]", required=False),
        name="spec",
    )
    async def spec_command(self: AppCommand, action: str, spec_path: str, model_path: str | None) -> None:
        """Check a feature spec (SEAM_FEATURE_SPEC's format) and, given a model, that the model takes its features.

        \b
        seam spec check SPEC           the spec's features, in model order, or what is wrong and where
        seam spec check SPEC MODEL     also: the model's feature_names are the spec's, in order
        """
        try:
            spec = load_spec(spec_path)
        except SpecError as exc:
            raise SystemExit(f"seam spec check: {exc}") from None
        self.say(f"{spec_path}: {describe_spec(spec)}")
        if model_path is not None:
            from agents.model.runtime import ModelContractError, ModelRuntime

            try:
                runtime = ModelRuntime.load(Path(model_path), feature_names=spec.names, device="cpu")
            except (ModelContractError, OSError) as exc:
                raise SystemExit(f"seam spec check: model {model_path} does not fit {spec_path}: {exc}") from None
            self.say(f"{model_path}: model {runtime.info.tag} takes these {len(spec.names)} features, in this order")


MODEL_ACTIONS = ("deploy", "promote", "rollback", "shadow", "status")
DLQ_ACTIONS = ("replay",)


def _transition(action: str, path: str | None, canary: float | None,
                shadow: str | None, files: ModelFiles) -> Callable[[Deployment], Deployment]:
    """The change a ``seam model`` action makes to the current deployment (files are hashed here, now; a file
    the workers would refuse to read, outside SEAM_MODEL_DIR, is refused here first)."""
    if action in ("deploy", "shadow") and not path:
        raise DeploymentError(f"seam model {action} needs a PATH")
    if action != "deploy" and (canary is not None or shadow is not None):
        raise DeploymentError("--canary and --shadow go with seam model deploy")

    def ref_of(named: str) -> ModelRef:
        return ModelRef.of(files.allowed(named))

    if action == "deploy":
        assert path is not None
        return functools.partial(deploy, model=ref_of(path), canary_percent=canary,
                                 shadow=None if shadow is None else ref_of(shadow))
    if action == "shadow":
        assert path is not None
        ref = None if path == "off" else ref_of(path)
        return lambda current: set_shadow(current, ref)
    return promote if action == "promote" else rollback


def describe(deployment: Deployment, *, source: str) -> str:
    """A deployment for people: one line per model, then the record itself."""
    lines = [f"deployment revision {deployment.revision} ({deployment.command or 'start'}; {source})",
             f"  primary  {deployment.primary.path}  sha256 {deployment.primary.sha256[:12]}"]
    if deployment.canary is not None:
        lines.append(f"  canary   {deployment.canary.path}  sha256 {deployment.canary.sha256[:12]}  "
                     f"{deployment.canary_percent:g} % of cards")
    if deployment.shadow is not None:
        lines.append(f"  shadow   {deployment.shadow.path}  sha256 {deployment.shadow.sha256[:12]}")
    lines.append(json.dumps(deployment.as_dict(with_history=False)))
    return "\n".join(lines)
