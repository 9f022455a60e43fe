// Precheck (#/prechecks/<id>): the verdicts as a bar (click one to list its
// items), the warnings, the full digest, how long it stays young enough to
// approve, and the way to a plan.
import { useEffect, useState } from "preact/hooks";
import { can, planner } from "../api";
import { VERDICTS, VerdictBar } from "../components/VerdictBar";
import type { Breakdown, PrecheckItem } from "../gen/redrive/v1/messages_pb";
import type { Caller } from "../gen/redrive/v1/planner_pb";
import { durationMs, fmtSpan, fmtTime, num, tsDate, verdictName } from "../format";
import { useLoad, useNow } from "../hooks";
import { showError } from "../errors";
import type { Timestamp, Duration } from "@bufbuild/protobuf/wkt";

export function Precheck({ caller, id }: { caller: Caller; id: string }) {
  const res = useLoad("GetPrecheck", () => planner.getPrecheck({ precheckId: id }), [id]);
  const [verdict, setVerdict] = useState<string | undefined>(undefined);
  const r = res.data;
  if (!r) return <section>{res.loading ? <p class="muted">Loading…</p> : <h1>Precheck {id}</h1>}</section>;
  const replayable = r.counts?.replayable ?? 0n;
  return (
    <section>
      <h1>
        Precheck <span class="mono">{r.precheckId}</span>
      </h1>
      <p class="muted">
        By {r.actor || "—"} at {fmtTime(r.createdAt)}: {num(r.total)} dead letters, {num(replayable)} replayable.
      </p>
      <PrecheckAge createdAt={r.createdAt} maxAge={caller.maxPrecheckAge} />
      {r.recentArrivals > 0n && (
        <p class="banner warn" data-testid="precheck-arrivals">
          {num(r.recentArrivals)} of them died in the {fmtSpan(durationMs(r.arrivalsWindow))} before this precheck: if
          more fail the same way after it, approval is refused until a new precheck takes them in.
        </p>
      )}
      <VerdictBar counts={r.counts} selected={verdict} onSelect={setVerdict} />
      {verdict && <VerdictItems precheckId={r.precheckId} verdict={verdict} key={verdict} />}

      <h2>Warnings</h2>
      <ul data-testid="precheck-warnings" class="warnings">
        {r.warnings.map((w, i) => (
          <li key={i}>{w}</li>
        ))}
      </ul>
      {r.warnings.length === 0 && <p class="muted">None.</p>}

      <h2>Digest</h2>
      <p>
        <code class="digest" data-testid="precheck-digest">
          {r.digest}
        </code>
      </p>

      <div class="toolbar">
        {can(caller, "CreatePlan") && (
          <a
            class="button primary"
            data-testid="plan-build"
            href={`#/plans/new?precheck=${encodeURIComponent(r.precheckId)}`}
          >
            Build a plan for the {num(replayable)} replayable items
          </a>
        )}
      </div>

      <h2>By error fingerprint</h2>
      <BreakdownTable rows={r.byErrorGroup} />
      <h2>By reason class</h2>
      <BreakdownTable rows={r.byReasonClass} />
      <h2>By destination</h2>
      <BreakdownTable rows={r.byDestination} />
      {r.staleness.length > 0 && (
        <>
          <h2>Staleness rules</h2>
          <table class="table">
            <thead>
              <tr>
                <th scope="col">Event type</th>
                <th scope="col">Rule</th>
                <th scope="col" class="num">Dead letters</th>
                <th scope="col" class="num">Stale</th>
                <th scope="col">Oldest</th>
              </tr>
            </thead>
            <tbody>
              {r.staleness.map((s, i) => (
                <tr key={i}>
                  <td class="mono">{s.eventType || "—"}</td>
                  <td class="mono">{s.rule || <span class="invalid">no rule: never stale</span>}</td>
                  <td class="num">{num(s.count)}</td>
                  <td class="num">{num(s.stale)}</td>
                  <td>{fmtSpan(durationMs(s.oldestAge))}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </>
      )}
    </section>
  );
}

/** "too old to approve in 4m 12s", or "too old to approve: run the precheck again". */
export function PrecheckAge({ createdAt, maxAge }: { createdAt?: Timestamp; maxAge?: Duration }) {
  const now = useNow(1000);
  const created = tsDate(createdAt);
  const max = durationMs(maxAge);
  let text: string;
  let old = false;
  if (!created || max <= 0) {
    text = "no maximum precheck age";
  } else {
    const left = created.getTime() + max - now;
    old = left <= 0;
    text = old ? "too old to approve: run the precheck again" : `too old to approve in ${fmtSpan(left)}`;
  }
  return (
    <p class={old ? "age invalid" : "age"} data-testid="precheck-age" role="timer">
      {text}
    </p>
  );
}

function VerdictItems({ precheckId, verdict }: { precheckId: string; verdict: string }) {
  const v = VERDICTS.find((x) => x.name === verdict)!;
  const [items, setItems] = useState<PrecheckItem[]>([]);
  const [next, setNext] = useState<string>("");
  const [busy, setBusy] = useState(false);
  const load = async (token: string) => {
    setBusy(true);
    try {
      const res = await planner.listPrecheckItems({ precheckId, verdict: v.verdict, pageSize: 100, pageToken: token });
      setItems((old) => (token === "" ? res.items : [...old, ...res.items]));
      setNext(res.nextPageToken);
    } catch (err) {
      showError("ListPrecheckItems", err);
    } finally {
      setBusy(false);
    }
  };
  useEffect(() => {
    load("");
  }, [precheckId, verdict]);
  return (
    <div data-testid="verdict-items" data-verdict={verdict}>
      <h2>Items: {verdict.replace(/_/g, " ")}</h2>
      <table class="table">
        <thead>
          <tr>
            <th scope="col">Dead letter</th>
            <th scope="col">Message id</th>
            <th scope="col">Message key</th>
            <th scope="col">Verdict</th>
            <th scope="col">Reason</th>
          </tr>
        </thead>
        <tbody>
          {items.map((it) => (
            <tr key={it.deadLetterId} data-testid="verdict-item" data-id={it.deadLetterId}>
              <td class="mono">
                <a href={`#/dead-letters/${encodeURIComponent(it.deadLetterId)}`}>{it.deadLetterId}</a>
              </td>
              <td class="mono" data-testid="verdict-item-message-id">{it.messageId || "—"}</td>
              <td class="mono">{it.messageKey}</td>
              <td>{verdictName(it.verdict).replace(/^verdict_/, "")}</td>
              <td class="wrap">{it.reason}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {next && (
        <button type="button" disabled={busy} onClick={() => load(next)}>
          More items
        </button>
      )}
    </div>
  );
}

function BreakdownTable({ rows }: { rows: Breakdown[] }) {
  if (rows.length === 0) return <p class="muted">None.</p>;
  return (
    <table class="table">
      <thead>
        <tr>
          <th scope="col">Value</th>
          <th scope="col" class="num">Total</th>
          {VERDICTS.map((v) => (
            <th scope="col" class="num" key={v.name}>
              {v.name.replace(/_/g, " ")}
            </th>
          ))}
        </tr>
      </thead>
      <tbody>
        {rows.map((b, i) => (
          <tr key={i}>
            <td class="mono">{b.value || "—"}</td>
            <td class="num">{num(b.total)}</td>
            {VERDICTS.map((v) => (
              <td class="num" key={v.name}>
                {num(b.counts?.[v.field] ?? 0n)}
              </td>
            ))}
          </tr>
        ))}
      </tbody>
    </table>
  );
}
