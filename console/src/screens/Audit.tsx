// Audit (#/plans/<id>/audit): counts, what was sent and what was not (with
// reasons), what no executor attempted, the operators' timeline, and the
// CSV / JSONL export.
import { useState } from "preact/hooks";
import { planner } from "../api";
import { showError } from "../errors";
import { AuditAction, Wave } from "../gen/redrive/v1/messages_pb";
import { ExportFormat } from "../gen/redrive/v1/planner_pb";
import { actionName, fmtTime, num, stateName } from "../format";
import { useLoad } from "../hooks";

const ACTIONS = [
  "sent",
  "skipped_duplicate",
  "skipped_stale",
  "skipped_state",
  "needs_compensation",
  "failed",
  "unroutable",
  "uncertain",
] as const;

const COUNT_FIELD: Record<(typeof ACTIONS)[number], string> = {
  sent: "sent",
  skipped_duplicate: "skippedDuplicate",
  skipped_stale: "skippedStale",
  skipped_state: "skippedState",
  needs_compensation: "needsCompensation",
  failed: "failed",
  unroutable: "unroutable",
  uncertain: "uncertain",
};

export function Audit({ id }: { id: string }) {
  const res = useLoad("GetAuditReport", () => planner.getAuditReport({ planId: id }), [id]);
  const r = res.data;
  if (!r) return <section>{res.loading ? <p class="muted">Loading…</p> : <h1>Audit of plan {id}</h1>}</section>;

  const counts = r.counts as unknown as Record<string, bigint> | undefined;

  return (
    <section>
      <h1>
        Audit of plan{" "}
        <a class="mono" href={`#/plans/${encodeURIComponent(id)}`}>
          {id}
        </a>
      </h1>
      {r.plan && (
        <p class="muted">
          {stateName(r.plan.state)}; {num(r.plan.totalItems)} items; created by {r.plan.createdBy || "—"}
          {r.plan.approvedBy && `, approved by ${r.plan.approvedBy}`}
        </p>
      )}
      <div class="toolbar">
        <ExportButton planId={id} format="csv" />
        <ExportButton planId={id} format="jsonl" />
      </div>

      <h2>Counts</h2>
      <table class="table counts" data-testid="audit-counts">
        <tbody>
          {ACTIONS.map((a) => (
            <tr key={a}>
              <th scope="row">{a.replace(/_/g, " ")}</th>
              <td class="num" data-testid={`audit-count-${a}`}>
                {num(counts?.[COUNT_FIELD[a]] ?? 0n)}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      {r.possiblyDuplicatedKeys.length > 0 && (
        <div class="banner warn" data-testid="audit-possibly-duplicated">
          Possibly delivered more than once (published again after a lost lease or confirm):{" "}
          <span class="mono">{r.possiblyDuplicatedKeys.join(", ")}</span>
        </div>
      )}

      <AuditEvents planId={id} />

      <h2>Never attempted: {num(r.neverAttempted)}</h2>
      <table class="table" data-testid="audit-never-attempted">
        <thead>
          <tr>
            <th scope="col">Dead letter</th>
            <th scope="col">Message key</th>
            <th scope="col">Message id</th>
            <th scope="col">Wave</th>
          </tr>
        </thead>
        <tbody>
          {r.neverAttemptedItems.map((u) => (
            <tr key={u.deadLetterId} data-testid="never-attempted-row" data-id={u.deadLetterId}>
              <td class="mono">
                <a href={`#/dead-letters/${encodeURIComponent(u.deadLetterId)}`}>{u.deadLetterId}</a>
              </td>
              <td class="mono">{u.messageKey}</td>
              <td class="mono">{u.messageId || "—"}</td>
              <td class="nowrap">{u.wave === 1 ? "canary" : u.wave === 2 ? "main" : "—"}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {r.neverAttempted > BigInt(r.neverAttemptedItems.length) && (
        <p class="muted">The first {r.neverAttemptedItems.length} are listed.</p>
      )}

      <h2>Operator actions</h2>
      <ol class="timeline" data-testid="audit-timeline">
        {r.plan?.actions.map((a, i) => (
          <li key={i} data-testid="timeline-row" data-action={a.action}>
            <span class="nowrap">{fmtTime(a.at)}</span> <strong>{a.action}</strong> by {a.actor || "—"}
            {a.reason && <span>: {a.reason}</span>}
          </li>
        ))}
      </ol>
      {r.plan && r.plan.actionsOmitted > 0n && (
        <p class="muted">{num(r.plan.actionsOmitted)} older actions are not shown.</p>
      )}
    </section>
  );
}

function ExportButton({ planId, format }: { planId: string; format: "csv" | "jsonl" }) {
  const [busy, setBusy] = useState(false);
  const run = async () => {
    setBusy(true);
    try {
      const chunks: Uint8Array[] = [];
      const fmt = format === "csv" ? ExportFormat.CSV : ExportFormat.JSONL;
      for await (const c of planner.exportAudit({ planId, format: fmt })) chunks.push(c.data);
      const type = format === "csv" ? "text/csv" : "application/x-ndjson";
      const url = URL.createObjectURL(new Blob(chunks as BlobPart[], { type }));
      const a = document.createElement("a");
      a.href = url;
      a.download = `plan-${planId}-audit.${format}`;
      a.hidden = true;
      document.body.appendChild(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
    } catch (err) {
      showError("ExportAudit", err);
    } finally {
      setBusy(false);
    }
  };
  return (
    <button type="button" data-testid={`export-${format === "csv" ? "csv" : "json"}`} disabled={busy} onClick={run}>
      {busy ? "Exporting…" : `Export as ${format.toUpperCase()}`}
    </button>
  );
}

/** Events per page of the events table. */
const EVENTS_PAGE = 100;

/**
 * Every audit event of the plan by message id, in commit order, paged and
 * filtered by action on the server (ListAuditEvents): reconciliation by
 * message id.
 */
function AuditEvents({ planId }: { planId: string }) {
  const [filter, setFilter] = useState("");
  // tokens[i] is the token of page i; the last one is the page shown.
  const [tokens, setTokens] = useState<string[]>([""]);
  const token = tokens[tokens.length - 1];
  const page = useLoad(
    "ListAuditEvents",
    () =>
      planner.listAuditEvents({
        planId,
        actions: filter === "" ? [] : [actionByName(filter)],
        pageSize: EVENTS_PAGE,
        pageToken: token,
      }),
    [planId, filter, token],
  );
  return (
    <>
      <h2>Events by message</h2>
      <label class="field inline">
        <span>Show</span>
        <select
          data-testid="audit-filter-action"
          value={filter}
          onChange={(e) => {
            setFilter(e.currentTarget.value);
            setTokens([""]);
          }}
        >
          <option value="">every action</option>
          {ACTIONS.map((a) => (
            <option value={a} key={a}>
              {a.replace(/_/g, " ")}
            </option>
          ))}
        </select>
      </label>
      <table class="table">
        <thead>
          <tr>
            <th scope="col">Message id</th>
            <th scope="col">Action</th>
            <th scope="col">Message key</th>
            <th scope="col">Dead letter</th>
            <th scope="col">Wave</th>
            <th scope="col">Reason</th>
            <th scope="col">At</th>
          </tr>
        </thead>
        <tbody>
          {page.data?.events.map((e, i) => (
            <tr key={i} data-testid="audit-row" data-action={actionName(e.action)}>
              <td class="mono" data-testid="audit-message-id">
                {e.messageId || "—"}
              </td>
              <td>{actionName(e.action).replace(/_/g, " ")}</td>
              <td class="mono">{e.messageKey}</td>
              <td class="mono">
                <a href={`#/dead-letters/${encodeURIComponent(e.deadLetterId)}`}>{e.deadLetterId}</a>
              </td>
              <td class="nowrap">{e.wave === Wave.CANARY ? "canary" : "main"}</td>
              <td class="wrap">{e.reason}</td>
              <td class="nowrap">{fmtTime(e.at)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {page.data && page.data.events.length === 0 && <p class="muted">No event.</p>}
      <div class="pager">
        <button
          type="button"
          data-testid="audit-prev-page"
          disabled={tokens.length < 2 || page.loading}
          onClick={() => setTokens(tokens.slice(0, -1))}
        >
          Previous page
        </button>
        <button
          type="button"
          data-testid="audit-next-page"
          disabled={!page.data?.nextPageToken || page.loading}
          onClick={() => page.data && setTokens([...tokens, page.data.nextPageToken])}
        >
          Next page
        </button>
      </div>
    </>
  );
}

/** The AuditAction whose name is `name` (`sent`, `skipped_stale`, ...). */
function actionByName(name: string): AuditAction {
  const key = name.toUpperCase() as keyof typeof AuditAction;
  return AuditAction[key] ?? AuditAction.UNSPECIFIED;
}

