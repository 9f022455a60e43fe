#!/usr/bin/env python3
"""Runs one Redrive replay from an orchestrator: precheck, plan, approval, replay, report.

Meant for an Airflow task, a Temporal activity or a cron job: one run of the
script is one replay, and a retry of the same job (same --run-id) picks up
the same precheck and the same plan instead of making new ones.

    ./generate.sh
    python3 orchestrate.py --planner 127.0.0.1:50051 --actor airflow \\
        --source orders.dlq --rate 50 --burst 10 \\
        --rationale 'orders-api takes 300/s; 50/s leaves headroom' \\
        --run-id "$AIRFLOW_RUN_ID" --report report.json

1. Runs a precheck over the selection (--source, repeatable; --error-group,
   repeatable) and prints the verdict counts and the digest.
2. Creates a plan (--rate, --burst, --rationale; --webhook-url with
   --webhook-secret-file for the plan's own Standard Webhooks). Both calls
   send the gRPC metadata `idempotency-key`, derived from --run-id
   (`redrive-orch:RUN_ID:precheck`, `redrive-orch:RUN_ID:create`): a retried
   job gets the first call's answer, so the same plan.
3. Waits for a second principal to approve it (polling GetPlan every
   --poll-interval, at most --approval-timeout), printing who to ask.
4. Follows the plan with WatchPlan until it ends, reconnecting when the
   stream breaks, one line per change of its progress.
5. Writes the audit report (GetAuditReport, and the SHA-256 of the JSON
   Lines export: the `report_digest` of docs/webhooks.md) to --report as
   JSON, and the export itself to --export when given.

Exit status (also in the report's `exit_code`):

    0   the plan completed
    1   the planner refused a call (the message says why), or another error
    2   bad arguments
    3   nothing to replay: the precheck found no replayable dead letter
    4   nobody approved the plan within --approval-timeout (it stays
        awaiting approval; a retry with the same --run-id waits for it again)
    5   the plan ended without completing: aborted, cancelled, or paused
        longer than --pause-timeout (the report says which and why)
    69  the planner is unreachable (after retries)

The report is written for exits 0, 3, 4 and 5, so the orchestrator can fail
the job with the report attached. Connection flags and REDRIVE_TOKEN are
those of client.py (redrive_client.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from google.protobuf import duration_pb2, json_format

from redrive_client import (
    EX_UNAVAILABLE,
    Metadata,
    add_connection_arguments,
    grpc,
    messages_pb2,
    metadata_for,
    open_channel,
    planner_pb2,
    planner_pb2_grpc,
)

EXIT_COMPLETED = 0
EXIT_ERROR = 1
EXIT_NOTHING_REPLAYABLE = 3
EXIT_APPROVAL_TIMEOUT = 4
EXIT_NOT_COMPLETED = 5

# The request metadata key the planner reads idempotency keys from.
IDEMPOTENCY_METADATA = "idempotency-key"
# How long one WatchPlan stream is kept before it is opened again (a check
# of the pause timeout, and a guard against a stream that went quiet).
WATCH_WINDOW_SECONDS = 60.0
# Unary calls that fail with these are tried again (a keyed call safely:
# the planner answers a retry with the first call's answer).
RETRIED = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
ATTEMPTS = 6

S = messages_pb2.PlanState
FINAL_STATES = {S.PLAN_STATE_COMPLETED, S.PLAN_STATE_CANCELLED, S.PLAN_STATE_ABORTED}

Answer = TypeVar("Answer")


class Unreachable(Exception):
    """The planner did not answer after every retry."""


def log(line: str) -> None:
    print(line, flush=True)


def state_name(state: int) -> str:
    """`awaiting_approval` for PLAN_STATE_AWAITING_APPROVAL."""
    return messages_pb2.PlanState.Name(state).removeprefix("PLAN_STATE_").lower()


def duration(text: str) -> float:
    """Seconds from `90`, `90s`, `15m`, `1h` or `1.5h`."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 15m or 1h")
    value, unit = float(match.group(1)), match.group(2) or "s"
    return value * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]


def idempotency_key(run_id: str, step: str) -> str:
    """`redrive-orch:RUN_ID:STEP`, or with RUN_ID's SHA-256 when it would not
    fit a key (1 to 255 visible ASCII characters)."""
    key = f"redrive-orch:{run_id}:{step}"
    if len(key) <= 255 and all(33 <= ord(char) <= 126 for char in key):
        return key
    return f"redrive-orch:sha256-{hashlib.sha256(run_id.encode()).hexdigest()}:{step}"


def keyed(metadata: Metadata, key: str) -> Metadata:
    return [*metadata, (IDEMPOTENCY_METADATA, key)]


def call(method: Callable[..., Answer], request: Any, metadata: Metadata, timeout: float = 60.0) -> Answer:
    """`method(request)`, tried again with backoff while the planner is
    unavailable or slow; other errors are raised at once."""
    delay = 1.0
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return method(request, metadata=metadata, timeout=timeout)
        except grpc.RpcError as error:
            if error.code() not in RETRIED:
                raise
            if attempt == ATTEMPTS:
                raise Unreachable(f"{error.code().name}: {error.details()}") from error
            log(f"planner: {error.code().name} ({error.details()}); trying again in {delay:.0f}s")
            time.sleep(delay)
            delay = min(delay * 2, 30.0)
    raise AssertionError("unreachable")


def counts_text(message: Any) -> str:
    """The non-zero counters of a VerdictCounts or ActionCounts, `name n`."""
    parts = [f"{field.name} {value}" for field, value in message.ListFields() if value]
    return ", ".join(parts) or "none"


def progress_line(plan: Any) -> str:
    line = (
        f"{state_name(plan.state)}  {plan.items_done}/{plan.total_items} done"
        f"  slices {plan.slices_completed}/{plan.slices_total}  {counts_text(plan.counts)}"
    )
    if plan.state_reason:
        line += f"  ({plan.state_reason})"
    return line


def to_json(message: Any) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


class Orchestration:
    """One run: the planner stub, the caller's metadata and what is known so far."""

    def __init__(self, args: argparse.Namespace, planner: Any, metadata: Metadata) -> None:
        self.args = args
        self.planner = planner
        self.metadata = metadata
        self.precheck: Any = None
        self.plan: Any = None
        self.outcome = ""

    # 1. Precheck ---------------------------------------------------------

    def run_precheck(self) -> Any:
        selector = messages_pb2.Selector(sources=self.args.source, error_groups=self.args.error_group)
        report = call(
            self.planner.RunPrecheck,
            planner_pb2.RunPrecheckRequest(selector=selector),
            keyed(self.metadata, idempotency_key(self.args.run_id, "precheck")),
            timeout=600,
        )
        self.precheck = report
        log(f"precheck {report.precheck_id}: {report.total} dead letters; {counts_text(report.counts)}")
        log(f"digest {report.digest}")
        for warning in report.warnings:
            log(f"  warning: {warning}")
        return report

    # 2. Plan -------------------------------------------------------------

    def create_plan(self) -> Any:
        args = self.args
        request = planner_pb2.CreatePlanRequest(
            precheck_id=self.precheck.precheck_id,
            rate=messages_pb2.Rate(per_second=args.rate, burst=args.burst, rationale=args.rationale),
        )
        if args.slice_size:
            request.slice_size = args.slice_size
        if args.canary_fraction is not None:
            request.canary_fraction = args.canary_fraction
        if args.observe is not None:
            request.observe_for.CopyFrom(duration_pb2.Duration(seconds=int(args.observe)))
        if args.webhook_url:
            request.webhook_url = args.webhook_url
        if args.webhook_secret_file:
            with open(args.webhook_secret_file, encoding="utf-8") as file:
                request.webhook_secret = file.read().strip()
        plan = call(self.planner.CreatePlan, request, keyed(self.metadata, idempotency_key(args.run_id, "create")))
        self.plan = plan
        log(f"plan {plan.plan_id} {state_name(plan.state)}, created by {plan.created_by or '-'}, {plan.total_items} items")
        return plan

    def get_plan(self) -> Any:
        self.plan = call(self.planner.GetPlan, planner_pb2.GetPlanRequest(plan_id=self.plan.plan_id), self.metadata)
        return self.plan

    # 3. Approval ---------------------------------------------------------

    def wait_for_approval(self) -> bool:
        """Whether the plan left awaiting_approval within --approval-timeout."""
        if self.plan.state != S.PLAN_STATE_AWAITING_APPROVAL:
            return True
        caller = call(self.planner.GetCaller, planner_pb2.GetCallerRequest(), self.metadata)
        who = "someone with the approver role"
        if caller.four_eyes:
            who += f" other than {self.plan.created_by} (four-eyes)"
        log(
            f"waiting up to {self.args.approval_timeout:.0f}s for {who} to approve:"
            f" redrivectl plan approve {self.plan.plan_id} --digest {self.plan.precheck_digest}"
        )
        deadline = time.monotonic() + self.args.approval_timeout
        while True:
            plan = self.get_plan()
            if plan.state != S.PLAN_STATE_AWAITING_APPROVAL:
                if plan.approved_by:
                    log(f"approved by {plan.approved_by}")
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(self.args.poll_interval, max(0.0, deadline - time.monotonic())))

    # 4. Watch ------------------------------------------------------------

    def watch_until_end(self) -> bool:
        """Follows the plan until it is final (True), or paused longer than
        --pause-timeout (False)."""
        plan_id = self.plan.plan_id
        last_line = ""
        paused_since: float | None = None
        delay = 1.0

        def seen(plan: Any) -> bool:
            """Prints a changed plan; whether to stop watching."""
            nonlocal last_line, paused_since
            self.plan = plan
            line = progress_line(plan)
            if line != last_line:
                log(line)
                last_line = line
            if plan.state == S.PLAN_STATE_PAUSED:
                paused_since = paused_since or time.monotonic()
            else:
                paused_since = None
            return plan.state in FINAL_STATES or self.paused_too_long(paused_since)

        if seen(self.plan):
            return self.plan.state in FINAL_STATES
        while True:
            window = WATCH_WINDOW_SECONDS
            if paused_since is not None:
                window = max(0.5, min(window, paused_since + self.args.pause_timeout - time.monotonic()))
            try:
                stream = self.planner.WatchPlan(
                    planner_pb2.WatchPlanRequest(plan_id=plan_id), metadata=self.metadata, timeout=window
                )
                for update in stream:
                    if update.HasField("progress") and seen(update.progress):
                        stream.cancel()
                        return self.plan.state in FINAL_STATES
                    delay = 1.0
            except grpc.RpcError as error:
                code = error.code()
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    pass  # the window ended: look again
                elif code in {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
                              grpc.StatusCode.CANCELLED, grpc.StatusCode.RESOURCE_EXHAUSTED}:
                    log(f"watch broke ({code.name}: {error.details()}); reconnecting in {delay:.0f}s")
                    time.sleep(delay)
                    delay = min(delay * 2, 30.0)
                else:
                    raise
            # The stream ended or broke: the plan as it is now decides.
            if seen(self.get_plan()):
                return self.plan.state in FINAL_STATES

    def paused_too_long(self, paused_since: float | None) -> bool:
        return paused_since is not None and time.monotonic() - paused_since >= self.args.pause_timeout

    # 5. Report -----------------------------------------------------------

    def write_report(self, exit_code: int) -> None:
        """Writes --report (and --export): what the run did and the audit."""
        report: dict[str, Any] = {
            "run_id": self.args.run_id,
            "outcome": self.outcome,
            "exit_code": exit_code,
        }
        if self.precheck is not None:
            report["precheck"] = {
                "precheck_id": self.precheck.precheck_id,
                "digest": self.precheck.digest,
                "total": self.precheck.total,
                "counts": to_json(self.precheck.counts),
                "warnings": list(self.precheck.warnings),
            }
        if self.plan is not None:
            plan_id = self.plan.plan_id
            audit = call(self.planner.GetAuditReport, planner_pb2.GetAuditReportRequest(plan_id=plan_id), self.metadata)
            self.plan = audit.plan
            export = self.export(plan_id)
            report.update(
                plan_id=plan_id,
                state=state_name(audit.plan.state),
                state_reason=audit.plan.state_reason,
                total_items=audit.plan.total_items,
                sent=audit.counts.sent,
                all_sent=audit.plan.total_items > 0 and audit.counts.sent == audit.plan.total_items,
                export_sha256=hashlib.sha256(export).hexdigest(),
                audit=to_json(audit),
            )
            if self.args.export:
                write_atomically(self.args.export, export)
        write_atomically(self.args.report, (json.dumps(report, indent=2, sort_keys=True) + "\n").encode())
        log(f"report written to {self.args.report}")

    def export(self, plan_id: str) -> bytes:
        """The plan's audit export in JSON Lines (ExportAudit's chunks joined);
        its SHA-256 is `report_digest` of the plan.ended webhook."""
        for attempt in range(1, ATTEMPTS + 1):
            try:
                chunks = self.planner.ExportAudit(
                    planner_pb2.ExportAuditRequest(plan_id=plan_id, format=planner_pb2.EXPORT_FORMAT_JSONL),
                    metadata=self.metadata,
                    timeout=300,
                )
                return b"".join(chunk.data for chunk in chunks)
            except grpc.RpcError as error:
                if error.code() not in RETRIED or attempt == ATTEMPTS:
                    raise
                time.sleep(attempt)
        raise AssertionError("unreachable")

    # All of it -----------------------------------------------------------

    def run(self) -> int:
        if self.run_precheck().counts.replayable == 0:
            self.outcome = "nothing_replayable"
            log("nothing to replay: no dead letter of the selection is replayable")
            return EXIT_NOTHING_REPLAYABLE
        self.create_plan()
        if not self.wait_for_approval():
            self.outcome = "approval_timeout"
            log(
                f"nobody approved plan {self.plan.plan_id} within {self.args.approval_timeout:.0f}s;"
                " it stays awaiting approval (a retry with the same --run-id waits for it again)"
            )
            return EXIT_APPROVAL_TIMEOUT
        if not self.watch_until_end():
            self.outcome = "paused_too_long"
            log(f"plan {self.plan.plan_id} paused longer than {self.args.pause_timeout:.0f}s: {self.plan.state_reason}")
            return EXIT_NOT_COMPLETED
        self.outcome = state_name(self.plan.state)
        if self.plan.state == S.PLAN_STATE_COMPLETED:
            log(f"plan {self.plan.plan_id} completed: {counts_text(self.plan.counts)}")
            return EXIT_COMPLETED
        log(f"plan {self.plan.plan_id} {self.outcome}: {self.plan.state_reason or 'no reason given'}")
        return EXIT_NOT_COMPLETED


def write_atomically(path: str, data: bytes) -> None:
    """Writes `data` to `path` through a temporary file beside it."""
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "wb") as file:
        file.write(data)
    os.replace(temporary, path)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Exit status: 0 completed, 1 error, 2 bad arguments, 3 nothing replayable, "
        "4 approval timeout, 5 aborted/cancelled/paused too long, 69 planner unreachable.",
    )
    add_connection_arguments(parser)
    selection = parser.add_argument_group("selection")
    selection.add_argument("--source", action="append", required=True, help="a DLQ to replay from (repeatable)")
    selection.add_argument("--error-group", action="append", default=[], metavar="FP", help="only this error fingerprint (repeatable)")
    plan = parser.add_argument_group("plan")
    plan.add_argument("--rate", type=float, required=True, help="messages per second")
    plan.add_argument("--burst", type=int, required=True, help="messages that may go at once")
    plan.add_argument("--rationale", required=True, help="why the downstream takes this rate")
    plan.add_argument("--slice-size", type=int, help="items per slice (planner default 100)")
    plan.add_argument("--canary-fraction", type=float, help="fraction in the canary wave (planner default 0.01)")
    plan.add_argument("--observe", type=duration, help="observation after the canary, e.g. 15m (planner default 15m)")
    plan.add_argument("--webhook-url", help="also post this plan's events here (docs/webhooks.md)")
    plan.add_argument("--webhook-secret-file", help="file holding the whsec_ secret (needed with --webhook-url)")
    run = parser.add_argument_group("run")
    run.add_argument(
        "--run-id",
        default=os.environ.get("REDRIVE_RUN_ID"),
        help="the job run's id (Airflow's run_id, a Temporal workflow id): the idempotency keys' base (env REDRIVE_RUN_ID)",
    )
    run.add_argument("--approval-timeout", type=duration, default=3600.0, help="how long to wait for approval (default 1h)")
    run.add_argument("--pause-timeout", type=duration, default=1800.0, help="fail when paused this long (default 30m)")
    run.add_argument("--poll-interval", type=duration, default=10.0, help="GetPlan interval while awaiting approval (default 10s)")
    run.add_argument("--report", required=True, metavar="FILE", help="write the JSON report here")
    run.add_argument("--export", metavar="FILE", help="also write the audit export (JSON Lines) here")
    args = parser.parse_args()
    if not args.run_id:
        parser.error("--run-id (or REDRIVE_RUN_ID) is required: it makes a retried job find its plan again")
    if args.webhook_url and not args.webhook_secret_file:
        parser.error("--webhook-url needs --webhook-secret-file")
    return args


def main() -> int:
    args = parse_arguments()
    with open_channel(args) as channel:
        orchestration = Orchestration(args, planner_pb2_grpc.PlannerStub(channel), metadata_for(args))
        try:
            code = orchestration.run()
            orchestration.write_report(code)
            return code
        except Unreachable as error:
            print(f"planner unreachable: {error}", file=sys.stderr, flush=True)
            return EX_UNAVAILABLE
        except grpc.RpcError as error:
            # FAILED_PRECONDITION on CreatePlan with our key: this run id
            # already made a plan from another request (other flags, or
            # another precheck); INVALID_ARGUMENT names the bad field.
            print(f"{error.code().name}: {error.details()}", file=sys.stderr, flush=True)
            return EX_UNAVAILABLE if error.code() == grpc.StatusCode.UNAVAILABLE else EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
