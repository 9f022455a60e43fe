#!/usr/bin/env python3
"""A minimal Redrive client from Python's standard gRPC tooling.

Calls redrive.v1.Planner/SummarizeDeadLetters and redrive.v1.Planner/ListPlans
with stubs generated from proto/redrive/v1/*.proto (run ./generate.sh first;
the connection setup is redrive_client.py's, shared with orchestrate.py),
naming the caller in the `x-redrive-actor` metadata the planner records on
prechecks, plans and operator actions.

    ./generate.sh
    python3 client.py --planner 127.0.0.1:50051 --actor alice [--source orders.dlq]
    REDRIVE_TOKEN=... python3 client.py --planner https://planner:50051 --ca ca.pem

With an https:// planner it uses TLS (--ca, else the platform's roots; a
client certificate with --tls-client-cert/--tls-client-key) and sends the
bearer token in REDRIVE_TOKEN as `authorization: Bearer TOKEN`; the actor is
then sent only when --actor or REDRIVE_ACTOR names one (a principal without
the delegate permission may only name itself).
"""

import argparse
import sys

from redrive_client import (
    EX_UNAVAILABLE,
    add_connection_arguments,
    grpc,
    messages_pb2,
    metadata_for,
    open_channel,
    planner_pb2,
    planner_pb2_grpc,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_connection_arguments(parser)
    parser.add_argument("--source", action="append", default=[], help="a DLQ to summarize (repeatable; default all)")
    args = parser.parse_args()
    metadata = metadata_for(args)

    with open_channel(args) as channel:
        planner = planner_pb2_grpc.PlannerStub(channel)
        try:
            summary = planner.SummarizeDeadLetters(
                planner_pb2.SummarizeDeadLettersRequest(
                    selector=messages_pb2.Selector(sources=args.source),
                    group_by=[
                        planner_pb2.SUMMARY_DIMENSION_SOURCE,
                        planner_pb2.SUMMARY_DIMENSION_REASON,
                    ],
                ),
                metadata=metadata,
                timeout=10,
            )
            plans = planner.ListPlans(
                planner_pb2.ListPlansRequest(page_size=20),
                metadata=metadata,
                timeout=10,
            )
        except grpc.RpcError as error:
            # UNAVAILABLE: planner down, or still waiting for PostgreSQL;
            # INVALID_ARGUMENT names the bad field.
            print(f"{error.code().name}: {error.details()}", file=sys.stderr)
            return EX_UNAVAILABLE if error.code() == grpc.StatusCode.UNAVAILABLE else 1

    print(f"{summary.total} dead letters")
    for group in summary.groups:
        key = ", ".join(f"{name}={value or '-'}" for name, value in sorted(group.key.items()))
        last_seen = group.last_seen.ToDatetime().isoformat() if group.HasField("last_seen") else "-"
        print(f"  {group.count:>8}  {key}  (last seen {last_seen})")
    print(f"{len(plans.plans)} plans")
    for plan in plans.plans:
        state = messages_pb2.PlanState.Name(plan.state)
        print(
            f"  {plan.plan_id}  {state}  {plan.counts.sent}/{plan.total_items} sent"
            f"  created by {plan.created_by or '-'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
