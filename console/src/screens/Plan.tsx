// One plan (#/plans/<id>): approval, live progress (WatchPlan, restarted
// while the plan is not final), the sent-per-second chart, gates, and the
// operator's controls.
import type { ComponentChildren } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import { can, formatError, planner } from "../api";
import { ActionButton } from "../components/ActionButton";
import { RateChart } from "../components/RateChart";
import { clearErrorOf, showError } from "../errors";
import { AuditAction, PlanState, type AuditEvent, type Plan as PlanMsg } from "../gen/redrive/v1/messages_pb";
import type { Caller } from "../gen/redrive/v1/planner_pb";
import { canaryText, durationMs, fmtSpan, fmtTime, isFinal, num, stateName, tsDate } from "../format";
import { gateTrips as tripsOf } from "../gates";
import { useLoad, useNow } from "../hooks";
import { PrecheckAge } from "./Precheck";

/** How the arrivals gate's pause reason starts (planner/src/plan/gates.rs). */
const STILL_ARRIVING = "still arriving:";

/** ActionCounts' fields with their proto names (count-<name>). */
const COUNT_FIELDS = [
  ["sent", "sent"],
  ["skipped_duplicate", "skippedDuplicate"],
  ["skipped_stale", "skippedStale"],
  ["skipped_state", "skippedState"],
  ["needs_compensation", "needsCompensation"],
  ["failed", "failed"],
  ["unroutable", "unroutable"],
  ["uncertain", "uncertain"],
] as const;

const RUNNING = [PlanState.CANARY, PlanState.OBSERVING, PlanState.MAIN];

const sleep = (ms: number, signal: AbortSignal) =>
  new Promise<void>((resolve) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(t);
      resolve();
    });
  });

interface SentStats {
  seen: Set<string>;
  perSecond: Map<number, number>;
  total: number;
  lastSecond: number;
}

/** The plan, kept current by WatchPlan, and the SENT events seen so far. */
function useLivePlan(id: string) {
  const [plan, setPlanState] = useState<PlanMsg | null>(null);
  const [missing, setMissing] = useState<string | null>(null);
  // While the page's own stream is down, a still plan says nothing of the
  // executors.
  const [watchDown, setWatchDown] = useState(false);
  // When this page last saw the plan move (an item done, a new state): a
  // running plan that stands still for long has no executor working on it.
  const progress = useRef({ done: -1n, state: -1, at: Date.now() });
  const setPlan = (p: PlanMsg) => {
    const last = progress.current;
    if (p.itemsDone !== last.done || p.state !== last.state) {
      progress.current = { done: p.itemsDone, state: p.state, at: Date.now() };
    }
    setPlanState(p);
  };
  const stats = useRef<SentStats>({ seen: new Set(), perSecond: new Map(), total: 0, lastSecond: 0 });
  const [, setSentVersion] = useState(0);

  const onEvent = (e: AuditEvent) => {
    if (e.action !== AuditAction.SENT) return;
    const s = stats.current;
    // A restarted stream may repeat events: count each attempt once.
    const key = `${e.sliceId}/${e.deadLetterId}/${e.attempt}`;
    if (s.seen.has(key)) return;
    s.seen.add(key);
    s.total++;
    const at = tsDate(e.at);
    const sec = Math.floor((at ? at.getTime() : Date.now()) / 1000);
    s.perSecond.set(sec, (s.perSecond.get(sec) ?? 0) + 1);
    s.lastSecond = Math.max(s.lastSecond, sec);
    setSentVersion((v) => v + 1);
  };

  useEffect(() => {
    const ac = new AbortController();
    const signal = ac.signal;
    (async () => {
      let p: PlanMsg;
      try {
        p = await planner.getPlan({ planId: id }, { signal });
      } catch (err) {
        if (!signal.aborted) setMissing(formatError(err));
        return;
      }
      setPlan(p);
      let delay = 1000;
      while (!signal.aborted && !isFinal(p.state)) {
        try {
          for await (const m of planner.watchPlan({ planId: id, includeEvents: true }, { signal })) {
            if (delay > 1000) clearErrorOf("WatchPlan");
            delay = 1000;
            setWatchDown(false);
            if (m.update.case === "progress") {
              p = m.update.value;
              setPlan(p);
            } else if (m.update.case === "event") {
              onEvent(m.update.value);
            }
          }
        } catch (err) {
          if (signal.aborted) return;
          setWatchDown(true);
          showError("WatchPlan", err);
        }
        // The stream ended: if the plan is not final, look again and rewatch.
        await sleep(delay, signal);
        delay = Math.min(delay * 2, 15000);
        if (signal.aborted) return;
        try {
          p = await planner.getPlan({ planId: id }, { signal });
          setPlan(p);
        } catch (err) {
          if (!signal.aborted) showError("GetPlan", err);
        }
      }
    })();
    return () => ac.abort();
  }, [id]);

  return { plan, setPlan, stats: stats.current, missing, watchDown, progressAt: progress.current.at };
}

/** How long a running plan may stand still on this page before it says so:
 * 30 s, or three items' time at a slow rate. */
function stalledAfterMs(perSecond: number | undefined): number {
  return Math.max(30_000, perSecond && perSecond > 0 ? 3_000 / perSecond : 0);
}

export function Plan({ caller, id }: { caller: Caller; id: string }) {
  const { plan, setPlan, stats, missing, watchDown, progressAt } = useLivePlan(id);
  const now = useNow(1000);
  if (missing) {
    return (
      <section>
        <h1>{missing.startsWith("NOT_FOUND") ? "Plan not found" : "Plan not read"}</h1>
        <p data-testid="plan-missing">
          No plan <span class="mono">{id}</span> could be read: {missing}. <a href="#/plans">All plans</a>
        </p>
      </section>
    );
  }
  if (!plan) return <section><p class="muted">Loading…</p></section>;
  const stalledFor = now - progressAt;
  const stalled =
    (plan.state === PlanState.CANARY || plan.state === PlanState.MAIN) &&
    plan.totalItems > plan.itemsDone &&
    !watchDown &&
    stalledFor >= stalledAfterMs(plan.rate?.perSecond);

  const total = plan.totalItems;
  const notSent = total > plan.itemsDone ? total - plan.itemsDone : 0n;
  const mainItems = total > plan.canaryItems ? total - plan.canaryItems : 0n;
  const control = (testid: string, label: string, verb: string, count: string, rpc: "PausePlan" | "ResumePlan" | "PromotePlan" | "CancelPlan", danger = false) => (
    <ActionButton
      testid={testid}
      what={rpc}
      label={label}
      danger={danger}
      dialog={{
        title: `${verb} plan ${plan.planId}`,
        count,
        needsReason: true,
        confirmLabel: `${verb} plan`,
        body:
          rpc === "CancelPlan"
            ? "Cancelling is final: the plan sends nothing more and cannot be resumed (pause it to stop for a while). The items not yet sent stay dead letters, for a new precheck and plan."
            : undefined,
      }}
      run={async (reason) => {
        const req = { planId: plan.planId, reason };
        const fn =
          rpc === "PausePlan"
            ? planner.pausePlan
            : rpc === "ResumePlan"
              ? planner.resumePlan
              : rpc === "PromotePlan"
                ? planner.promotePlan
                : planner.cancelPlan;
        setPlan(await fn(req));
      }}
    />
  );

  // Both come from the server: the plan's re-dead-letter count, and the
  // pauses and aborts the gates recorded (not their promotions).
  const redead = plan.reDeadLetters > 0n;
  const gateTrips = tripsOf(plan.actions);
  const gateTripped = gateTrips.length > 0;
  // The ramp: every wave before the main one, then the main wave.
  const waves = plan.rampItems.length + 1;
  const lastRampWave = plan.rampStep + 1 >= plan.rampItems.length;
  const observingLeft = plan.state === PlanState.OBSERVING ? (tsDate(plan.observingUntil)?.getTime() ?? now) - now : 0;
  const nowSecond = Math.max(Math.floor(now / 1000), stats.lastSecond);

  return (
    <section>
      <h1>
        Plan <span class="mono">{plan.planId}</span>
      </h1>
      <div class="plan-head">
        <span class={`state s-${stateName(plan.state).replace(/ /g, "-")}`} data-testid="plan-state" data-state={stateName(plan.state)}>
          {stateName(plan.state)}
        </span>
        {waves > 2 && (plan.state === PlanState.CANARY || plan.state === PlanState.OBSERVING || plan.state === PlanState.MAIN) && (
          <span data-testid="plan-wave">
            wave {plan.state === PlanState.MAIN ? waves : plan.rampStep + 1} of {waves} (
            {plan.state === PlanState.MAIN ? "the rest" : `up to ${num(plan.rampItems[plan.rampStep] ?? 0n)} items`})
          </span>
        )}
        {plan.state === PlanState.OBSERVING && (
          <span data-testid="plan-countdown" role="timer">
            observing: the {lastRampWave ? "main wave" : "next wave"} starts in {fmtSpan(observingLeft)} if the gates stay green
          </span>
        )}
        <a href={`#/plans/${encodeURIComponent(plan.planId)}/audit`} data-testid="plan-audit">
          Audit report
        </a>
      </div>

      {stalled && (
        <div class="banner warn" data-testid="plan-stalled" role="status">
          No item done for {fmtSpan(stalledFor)} (while this page was open). A running plan moves only while an
          executor holds one of its slices: check that one is running and can reach this planner, Redis and the
          broker; its log says what it waits for.
        </div>
      )}
      {redead && (
        <div class="banner danger" data-testid="redead-banner" role="alert">
          {num(plan.reDeadLetters)} replayed message(s) came back dead-lettered. Look at the new dead letters
          before going on.
        </div>
      )}
      {gateTripped && (
        <div class="banner warn" data-testid="gate-trips">
          <strong>Gate trips:</strong>
          <ul>
            {gateTrips.map((a, i) => (
              <li key={i}>
                {a.action} at {fmtTime(a.at)}: {a.reason}
              </li>
            ))}
          </ul>
        </div>
      )}

      <dl class="facts">
        <dt>Items</dt>
        <dd data-testid="plan-total">{num(total)}</dd>
        <dt>Done</dt>
        <dd>
          {num(plan.itemsDone)} of {num(total)}; slices {num(plan.slicesCompleted)} of {num(plan.slicesTotal)}
        </dd>
        <dt>Canary</dt>
        <dd>
          <span data-testid="plan-canary">{canaryText(plan.canaryItems, plan.totalItems, plan.canaryFraction)}</span>
          , then observe{" "}
          {fmtSpan(durationMs(plan.observeFor))}
        </dd>
        <dt>Rate</dt>
        <dd>
          {plan.rate?.perSecond ?? 0}/s, burst {plan.rate?.burst ?? 0}: <span class="muted">{plan.rate?.rationale}</span>
        </dd>
        <dt>Destination</dt>
        <dd>{destinationText(plan)}</dd>
        <dt>Precheck</dt>
        <dd class="mono">
          <a href={`#/prechecks/${encodeURIComponent(plan.precheckId)}`}>{plan.precheckId}</a>
        </dd>
        <dt>Precheck digest</dt>
        <dd>
          <code class="digest" data-testid="plan-digest">
            {plan.precheckDigest}
          </code>
        </dd>
        <dt>Created</dt>
        <dd>
          by {plan.createdBy || "—"} at {fmtTime(plan.createdAt)}
        </dd>
        {plan.approvedBy && (
          <>
            <dt>Approved</dt>
            <dd>
              by {plan.approvedBy} at {fmtTime(plan.approvedAt)}
            </dd>
          </>
        )}
        {plan.stateReason && !gateTripped && (
          <>
            <dt>State reason</dt>
            <dd data-testid="plan-state-reason">{plan.stateReason}</dd>
          </>
        )}
      </dl>

      {plan.state === PlanState.AWAITING_APPROVAL && <Approval caller={caller} plan={plan} onPlan={setPlan} />}

      <div class="toolbar" aria-label="Controls">
        {can(caller, "PausePlan") && RUNNING.includes(plan.state) &&
          control("plan-pause", `Pause plan (${num(notSent)} items not yet sent)`, "Pause", `${num(notSent)} items not yet sent`, "PausePlan")}
        {can(caller, "ResumePlan") && plan.state === PlanState.PAUSED &&
          control("plan-resume", `Resume plan (${num(notSent)} items not yet sent)`, "Resume", `${num(notSent)} items not yet sent`, "ResumePlan")}
        {can(caller, "ResumePlan") && plan.state === PlanState.PAUSED && plan.stateReason.startsWith(STILL_ARRIVING) && (
          <ActionButton
            testid="plan-resume-override"
            what="ResumePlan"
            label="Resume despite the arrivals"
            danger
            dialog={{
              title: `Resume plan ${plan.planId} despite the arrivals`,
              count: `${num(notSent)} items not yet sent`,
              body: <p>Dead letters failing like this plan's keep arriving; the plan will no longer pause for them. The override is recorded with your reason.</p>,
              needsReason: true,
              confirmLabel: "Resume despite the arrivals",
            }}
            run={async (reason) => setPlan(await planner.resumePlan({ planId: plan.planId, reason, overrideArrivals: true }))}
          />
        )}
        {can(caller, "PromotePlan") && plan.state === PlanState.OBSERVING &&
          control("plan-promote", `Promote to the main wave (${num(mainItems)} items)`, "Promote", `${num(mainItems)} main-wave items`, "PromotePlan")}
        {can(caller, "CancelPlan") && !isFinal(plan.state) &&
          control("plan-cancel", `Cancel plan (${num(notSent)} items not yet sent)`, "Cancel", `${num(notSent)} items not yet sent`, "CancelPlan", true)}
      </div>

      <h2>Outcomes</h2>
      <table class="table counts" data-testid="plan-counts">
        <tbody>
          {COUNT_FIELDS.map(([name, field]) => (
            <tr key={name}>
              <th scope="row">{name.replace(/_/g, " ")}</th>
              <td class="num" data-testid={`count-${name}`}>
                {num(plan.counts?.[field] ?? 0n)}
              </td>
            </tr>
          ))}
        </tbody>
      </table>

      <h2>Sent per second</h2>
      <RateChart perSecond={stats.perSecond} nowSecond={nowSecond} rate={plan.rate?.perSecond ?? 0} sentTotal={stats.total} />
      <p class="muted">{stats.total} sent events seen while this page was open (bars: the last 60 s; line: the plan's rate).</p>

      {plan.warnings.length > 0 && !gateTripped && (
        <>
          <h2>Warnings</h2>
          <ul class="warnings" data-testid="plan-warnings">
            {plan.warnings.map((w, i) => (
              <li key={i}>{w}</li>
            ))}
          </ul>
        </>
      )}
    </section>
  );
}

function destinationText(plan: PlanMsg): ComponentChildren {
  const m = plan.destination?.mode;
  if (!m || m.case === undefined || m.case === "queue") return "queue: the queue each message died in";
  if (m.case === "exchange") return "exchange: the death's exchange and routing keys";
  return (
    <>
      redirect to exchange <span class="mono">{m.value.exchange || "(default)"}</span>, routing key{" "}
      <span class="mono">{m.value.routingKey}</span>
    </>
  );
}

function Approval({ caller, plan, onPlan }: { caller: Caller; plan: PlanMsg; onPlan: (p: PlanMsg) => void }) {
  const pre = useLoad("GetPrecheck", () => planner.getPrecheck({ precheckId: plan.precheckId }), [plan.precheckId]);
  const ownPlan = caller.fourEyes && caller.name !== "" && plan.createdBy === caller.name;
  // The override is offered only once the planner refused as "still arriving".
  const [arriving, setArriving] = useState(false);
  const total = num(plan.totalItems);
  return (
    <div class="approval" data-testid="approval">
      <h2>Approval</h2>
      <p>
        Approving lets executors replay <strong data-testid="approve-counts">
          {total} items ({num(plan.canaryItems)} canary items first)
        </strong>{" "}
        from the precheck with this digest:
      </p>
      <p>
        <code class="digest" data-testid="approve-digest">
          {plan.precheckDigest}
        </code>
      </p>
      {pre.data && <PrecheckAge createdAt={pre.data.createdAt} maxAge={caller.maxPrecheckAge} />}
      {can(caller, "ApprovePlan") && (
        <div class="toolbar">
          <ActionButton
            testid="approve-button"
            what="ApprovePlan"
            primary
            disabled={ownPlan}
            label={`Approve plan for ${total} items`}
            dialog={{
              title: `Approve plan ${plan.planId}`,
              count: `${total} items (${num(plan.canaryItems)} canary items)`,
              body: (
                <>
                  <p data-testid="approve-terms">
                    They are published at {plan.rate?.perSecond ?? 0}/s (burst {plan.rate?.burst ?? 0}), canary first, to{" "}
                    {destinationText(plan)}.
                  </p>
                  <p>
                    You approve the precheck with digest <code class="digest">{plan.precheckDigest}</code>.
                  </p>
                </>
              ),
              confirmLabel: `Approve ${total} items`,
              typedCount: plan.totalItems > 100n ? total : undefined,
            }}
            run={async () => {
              try {
                onPlan(await planner.approvePlan({ planId: plan.planId, digest: plan.precheckDigest }));
              } catch (err) {
                if (formatError(err).includes(STILL_ARRIVING)) setArriving(true);
                throw err;
              }
            }}
          />
          {arriving && (
          <ActionButton
            testid="approve-override-button"
            what="ApprovePlan"
            danger
            disabled={ownPlan}
            label="Approve despite arrivals"
            dialog={{
              title: `Approve plan ${plan.planId} despite arrivals`,
              count: `${total} items (${num(plan.canaryItems)} canary items)`,
              body: (
                <p>
                  The approval was refused as "still arriving". Only when you know why: the plan will run while dead letters
                  failing like its own keep arriving. The override is recorded with your reason.
                </p>
              ),
              needsReason: true,
              confirmLabel: `Approve ${total} items despite arrivals`,
              typedCount: plan.totalItems > 100n ? total : undefined,
            }}
            run={async (reason) =>
              onPlan(
                await planner.approvePlan({
                  planId: plan.planId,
                  digest: plan.precheckDigest,
                  overrideArrivals: true,
                  overrideReason: reason,
                }),
              )
            }
          />
          )}
          {ownPlan && (
            <span class="invalid" data-testid="approve-disabled-reason">
              Four-eyes: you created this plan; another approver must approve it
            </span>
          )}
        </div>
      )}
      {!can(caller, "ApprovePlan") && (
        <p class="muted" data-testid="approve-needs-role">
          Approving needs the approver role, which {caller.name || "this sign-in"} does not have: send this page's link to an
          approver.
        </p>
      )}
    </div>
  );
}
