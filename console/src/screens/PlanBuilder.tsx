// Plan builder (#/plans/new?precheck=<id>): rate, canary, observation,
// destination and slices; a preview of the first messages exactly as an
// executor would publish them; then CreatePlan, once.
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import type { DestinationSchema } from "../gen/redrive/v1/messages_pb";
import { useState } from "preact/hooks";
import { can, planner } from "../api";
import { ActionButton } from "../components/ActionButton";
import { HeaderDiff } from "../components/HeaderDiff";
import { showError } from "../errors";
import { CreatePlanRequestSchema, type Caller, type CreatePlanRequest, type PreviewPlanResponse } from "../gen/redrive/v1/planner_pb";
import { num } from "../format";
import { useLoad } from "../hooks";
import { navigate } from "../router";

type Mode = "queue" | "exchange" | "redirect";

interface Form {
  perSecond: string;
  burst: string;
  rationale: string;
  canary: string;
  observeFor: string;
  mode: Mode;
  redirectExchange: string;
  redirectRoutingKey: string;
  sliceSize: string;
  ordered: boolean;
}

const DEFAULTS: Form = {
  perSecond: "10",
  burst: "10",
  rationale: "",
  canary: "0.01",
  observeFor: "900",
  mode: "queue",
  redirectExchange: "",
  redirectRoutingKey: "",
  sliceSize: "100",
  ordered: false,
};

/** The request, or what is wrong with the form. */
function toRequest(precheckId: string, f: Form): CreatePlanRequest | string {
  const perSecond = Number(f.perSecond);
  const burst = Number(f.burst);
  const canary = Number(f.canary);
  const observe = Number(f.observeFor);
  const slice = Number(f.sliceSize);
  if (!precheckId) return "No precheck: build a plan from a precheck.";
  if (!(perSecond > 0)) return "The rate must be above 0 per second.";
  if (!Number.isInteger(burst) || burst < 1) return "The burst must be a whole number, at least 1.";
  if (f.rationale.trim() === "") return "Say how the rate follows from the downstream's capacity (required).";
  if (!(canary > 0 && canary <= 1)) return "The canary fraction must be above 0 and at most 1.";
  if (!Number.isInteger(observe) || observe < 0) return "Observe for a whole number of seconds, 0 or more.";
  if (!Number.isInteger(slice) || slice < 1) return "The slice size must be a whole number, at least 1.";
  const destination: MessageInitShape<typeof DestinationSchema> =
    f.mode === "queue"
      ? { mode: { case: "queue" as const, value: {} } }
      : f.mode === "exchange"
        ? { mode: { case: "exchange" as const, value: {} } }
        : {
            mode: {
              case: "redirect" as const,
              value: { exchange: f.redirectExchange.trim(), routingKey: f.redirectRoutingKey.trim() },
            },
          };
  return create(CreatePlanRequestSchema, {
    precheckId,
    rate: { perSecond, burst, rationale: f.rationale.trim() },
    destination,
    sliceSize: slice,
    canaryFraction: canary,
    observeFor: { seconds: BigInt(observe), nanos: 0 },
    ordered: f.ordered,
  });
}

export function PlanBuilder({ caller, precheckId }: { caller: Caller; precheckId: string }) {
  const pre = useLoad("GetPrecheck", () => planner.getPrecheck({ precheckId }), [precheckId]);
  const [f, setF] = useState<Form>(DEFAULTS);
  const [preview, setPreview] = useState<PreviewPlanResponse | null>(null);
  const [previewing, setPreviewing] = useState(false);
  const req = toRequest(precheckId, f);
  const problem = typeof req === "string" ? req : null;
  const items = pre.data?.counts?.replayable;
  const set = <K extends keyof Form>(k: K, v: Form[K]) => {
    setF({ ...f, [k]: v });
    setPreview(null);
  };

  const runPreview = async () => {
    if (typeof req === "string") return;
    setPreviewing(true);
    try {
      setPreview(await planner.previewPlan({ plan: req, limit: 5 }));
    } catch (err) {
      showError("PreviewPlan", err);
    } finally {
      setPreviewing(false);
    }
  };

  const text = (k: keyof Form, testid: string, label: string, hint?: string, type = "text") => (
    <label class="field">
      <span>{label}</span>
      <input
        type={type}
        data-testid={testid}
        value={f[k] as string}
        step={type === "number" ? "any" : undefined}
        onInput={(e) => set(k, e.currentTarget.value as never)}
      />
      {hint && <small class="muted">{hint}</small>}
    </label>
  );

  return (
    <section>
      <h1>New plan</h1>
      <p>
        From precheck{" "}
        <a class="mono" href={`#/prechecks/${encodeURIComponent(precheckId)}`}>
          {precheckId || "—"}
        </a>
        {items !== undefined && `: ${num(items)} replayable items`}
      </p>
      <form class="plan-form" onSubmit={(e) => e.preventDefault()} aria-label="Plan settings">
        <fieldset>
          <legend>Rate</legend>
          {text("perSecond", "rate-per-second", "Messages per second", undefined, "number")}
          {text("burst", "rate-burst", "Burst (messages at once)", undefined, "number")}
          <label class="field wide">
            <span>Rationale (required): how the rate follows from the downstream's capacity</span>
            <textarea
              data-testid="rate-rationale"
              rows={2}
              value={f.rationale}
              onInput={(e) => set("rationale", e.currentTarget.value)}
            />
          </label>
        </fieldset>
        <fieldset>
          <legend>Canary</legend>
          {text("canary", "canary-fraction", "Canary fraction", "0.01 = 1% of the items, at least one", "number")}
          {text("observeFor", "observe-for", "Observe for (seconds)", "after the canary, before the main wave", "number")}
        </fieldset>
        <fieldset>
          <legend>Destination</legend>
          <label class="field">
            <span>Publish to</span>
            <select
              data-testid="destination-mode"
              value={f.mode}
              onChange={(e) => set("mode", e.currentTarget.value as Mode)}
            >
              <option value="queue">queue: the queue each message died in</option>
              <option value="exchange">exchange: the death's exchange and routing keys</option>
              <option value="redirect">redirect: an exchange and routing key you give</option>
            </select>
          </label>
          {f.mode === "redirect" && (
            <>
              {text("redirectExchange", "redirect-exchange", "Exchange", '"" is the default exchange')}
              {text("redirectRoutingKey", "redirect-routing-key", "Routing key")}
            </>
          )}
        </fieldset>
        <fieldset>
          <legend>Slices</legend>
          {text("sliceSize", "slice-size", "Items per slice", undefined, "number")}
          <label class="field checkbox">
            <input
              type="checkbox"
              data-testid="ordered"
              checked={f.ordered}
              onChange={(e) => set("ordered", e.currentTarget.checked)}
            />
            <span>Ordered: publish in dead-letter order (one executor at a time, slower)</span>
          </label>
        </fieldset>
      </form>
      {problem && (
        <p class="invalid" data-testid="plan-form-problem">
          {problem}
        </p>
      )}
      <div class="toolbar">
        <button type="button" data-testid="preview-run" disabled={!!problem || previewing} onClick={runPreview}>
          Preview the first messages
        </button>
        {can(caller, "CreatePlan") && (
          <ActionButton
            testid="plan-create"
            what="CreatePlan"
            primary
            label={`Create plan for ${items === undefined ? "…" : num(items)} items`}
            disabled={!!problem || items === undefined}
            dialog={{
              title: "Create the plan",
              count: `${num(items)} items`,
              body: (
                <p>
                  The plan replays {num(items)} items at {f.perSecond}/s once an approver approves it; nothing is sent
                  before.
                </p>
              ),
              confirmLabel: `Create plan for ${num(items)} items`,
            }}
            run={async () => {
              if (typeof req === "string") throw new Error(req);
              const plan = await planner.createPlan(req);
              navigate(`#/plans/${encodeURIComponent(plan.planId)}`);
            }}
          />
        )}
      </div>
      {preview && (
        <div data-testid="preview" class="preview">
          <h2>
            Preview: the first {preview.messages.length} of {num(preview.items)} messages
          </h2>
          {preview.messages.map((m) => (
            <article class="preview-message" data-testid="preview-message" data-id={m.deadLetterId} key={m.deadLetterId}>
              <dl class="facts">
                <dt>Dead letter</dt>
                <dd class="mono">
                  {m.deadLetterId} <span class="muted">message id {m.messageId || "—"}</span>
                </dd>
                <dt>Exchange</dt>
                <dd>
                  <span class="mono" data-testid="preview-exchange">
                    {m.exchange}
                  </span>
                  {m.exchange === "" && <span class="muted">(the default exchange)</span>}
                </dd>
                <dt>Routing key</dt>
                <dd class="mono" data-testid="preview-routing-key">
                  {m.routingKey}
                </dd>
                <dt>Body</dt>
                <dd>{num(m.bodyBytes)} bytes</dd>
              </dl>
              <HeaderDiff
                removed={m.removedHeaders}
                added={m.addedHeaders.map((h) => ({ name: h.name, value: h.value }))}
                kept={m.keptHeaders}
              />
            </article>
          ))}
        </div>
      )}
    </section>
  );
}
