// What each call the console makes does, in an operator's words: the error
// box says "Approving the plan failed", not "ApprovePlan failed" (the gRPC
// method stays in the box's tooltip, for a bug report).

const WORDS: Record<string, string> = {
  ApprovePlan: "Approving the plan",
  ArchiveDeadLetters: "Archiving the dead letter",
  CancelPlan: "Cancelling the plan",
  CreatePlan: "Creating the plan",
  ExportAudit: "Exporting the audit",
  GetAuditReport: "Loading the audit report",
  GetCaller: "Signing in",
  GetDeadLetter: "Loading the dead letter",
  GetPlan: "Loading the plan",
  GetPrecheck: "Loading the precheck",
  ListDeadLetters: "Loading the dead letters",
  ListPlans: "Loading the plans",
  ListPrecheckItems: "Loading the precheck's items",
  ListSources: "Loading the sources",
  PausePlan: "Pausing the plan",
  PreviewPlan: "Previewing the plan",
  PromotePlan: "Starting the main wave",
  RepairDeadLetter: "Saving the repair",
  ResumePlan: "Resuming the plan",
  RunPrecheck: "Running the precheck",
  SummarizeDeadLetters: "Counting the dead letters",
  WatchPlan: "Following the plan live",
};

/** `what` (a gRPC method, or already words) as an operator would say it. */
export function actionWords(what: string): string {
  return WORDS[what] ?? what;
}

/** The gRPC method behind `what`, when it is one the console calls. */
export function actionMethod(what: string): string | undefined {
  return what in WORDS ? `redrive.v1.Planner/${what}` : undefined;
}
