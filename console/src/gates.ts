// What the plan screen shows of the gates' decisions.
import type { OperatorAction } from "./gen/redrive/v1/messages_pb";

/** The actor the planner records gate decisions under (planner/src/plan/gates.rs, GATE_ACTOR). */
export const GATE_ACTOR = "redrive-gate";

/**
 * The actions of a gate that tripped: a pause or an abort by GATE_ACTOR (as
 * the planner's `plan.gate_tripped` webhook counts them, planner/src/webhooks.rs).
 * The gates also promote a plan whose observation window passed green
 * (`promote`, `next_wave`): those are no trips.
 */
export function gateTrips(actions: readonly OperatorAction[]): OperatorAction[] {
  return actions.filter((a) => a.actor === GATE_ACTOR && (a.action === "pause" || a.action === "abort"));
}
