// One dead letter (#/dead-letters/<id>): properties, headers, body, death
// history and lineage (revisions, re-dead-letters, archive history, keys).
import { useState } from "preact/hooks";
import { can, planner } from "../api";
import { ActionButton } from "../components/ActionButton";
import { showError } from "../errors";
import type { DeadLetter as DL } from "../gen/redrive/v1/messages_pb";
import { DeadLetterStatus, Origin, ReasonClass } from "../gen/redrive/v1/messages_pb";
import type { Caller } from "../gen/redrive/v1/planner_pb";
import { fmtTime, num, plainText, renderBody, tablePlain, type Plain } from "../format";
import { useLoad } from "../hooks";

export function latestBody(d: DL): Uint8Array {
  return d.revisions.length > 0 ? d.revisions[d.revisions.length - 1].body : d.body;
}

function enumWord(e: Record<number, string>, v: number, prefix = ""): string {
  return (e[v] ?? String(v)).replace(prefix, "").toLowerCase();
}

/** "(poison)" beside a value; nothing for an unspecified enum. */
function Aside({ word }: { word: string }) {
  return word === "unspecified" ? null : <span class="muted">({word})</span>;
}

export function DeadLetter({ caller, id }: { caller: Caller; id: string }) {
  const res = useLoad("GetDeadLetter", () => planner.getDeadLetter({ id }), [id]);
  const d = res.data?.deadLetter;
  if (!d) return <section>{res.loading ? <p class="muted">Loading…</p> : <h1>Dead letter {id}</h1>}</section>;
  const p = d.properties;
  const body = renderBody(latestBody(d), p?.contentType, d.bodyCompression, res.data?.bodyPreview ?? "");
  return (
    <section>
      <h1>
        Dead letter <span class="mono">{d.id}</span>
      </h1>
      <div class="toolbar">
        {can(caller, "RepairDeadLetter") && (
          <a class="button" data-testid="repair-open" href={`#/dead-letters/${encodeURIComponent(d.id)}/repair`}>
            Repair body (1 dead letter)
          </a>
        )}
        {can(caller, "ArchiveDeadLetters") && d.status !== DeadLetterStatus.ARCHIVED && (
          <ActionButton
            testid="archive-run"
            what="ArchiveDeadLetters"
            label="Archive 1 dead letter"
            dialog={{
              title: `Archive dead letter ${d.id}`,
              count: "1 dead letter",
              body: <p>Archived dead letters are resolved without a replay and left out of listings and prechecks.</p>,
              needsReason: true,
              confirmLabel: "Archive 1 dead letter",
            }}
            run={async (reason) => {
              await planner.archiveDeadLetters({ selector: { ids: [d.id] }, reason });
              res.reload();
            }}
          />
        )}
      </div>
      <dl class="facts">
        <dt>Source</dt>
        <dd class="mono">{d.source}</dd>
        <dt>Message id</dt>
        <dd class="mono" data-testid="dl-message-id">{d.messageId ?? "—"}</dd>
        <dt>Message key</dt>
        <dd class="mono">{d.messageKey}</dd>
        <dt>Status</dt>
        <dd data-testid="dl-status">{enumWord(DeadLetterStatus, d.status)}</dd>
        <dt>Reason</dt>
        <dd>
          {d.death?.reason || "—"} <Aside word={enumWord(ReasonClass, d.reasonClass)} />
        </dd>
        <dt>Error</dt>
        <dd class="error-text">{d.errorText ?? "—"}</dd>
        {d.errorClass && (
          <>
            <dt>Error class</dt>
            <dd class="mono">{d.errorClass}</dd>
          </>
        )}
        <dt>Fingerprint</dt>
        <dd class="mono" data-testid="dl-fingerprint">
          <a href={`#/dead-letters?source=${encodeURIComponent(d.source)}&group=${encodeURIComponent(d.errorGroup)}`}>{d.errorGroup}</a>
        </dd>
        <dt>Destination</dt>
        <dd class="mono">{d.destination}</dd>
        <dt>Died at</dt>
        <dd>{fmtTime(d.diedAt)}</dd>
        <dt>Captured at</dt>
        <dd>
          {fmtTime(d.capturedAt)} <Aside word={enumWord(Origin, d.origin)} />
        </dd>
        <dt>Event type / schema / producer</dt>
        <dd class="mono">
          {d.eventType ?? "—"} / {d.schemaVersion ?? "—"} / {d.producer ?? "—"}
        </dd>
        <dt>Content type</dt>
        <dd class="mono">
          {p?.contentType ?? "—"}
          {p?.contentEncoding ? ` (${p.contentEncoding})` : ""}
        </dd>
        <dt>Body</dt>
        <dd>
          {num(d.bodySize)} bytes, sha256 <span class="mono">{d.bodySha256}</span>
          {d.bodyOversized && <span class="badge warn">oversized: not replayable</span>}
        </dd>
        {d.captureNotes.length > 0 && (
          <>
            <dt>Capture notes</dt>
            <dd>
              <ul>
                {d.captureNotes.map((n, i) => (
                  <li key={i}>{n}</li>
                ))}
              </ul>
            </dd>
          </>
        )}
      </dl>

      <h2>Body{d.revisions.length > 0 ? ` (revision ${d.revisions[d.revisions.length - 1].revision})` : ""}</h2>
      {body.note && (
        <p class="note" data-testid="dl-body-note">
          {body.note}
        </p>
      )}
      <pre class="body" data-testid="dl-body" data-kind={body.kind}>
        {body.text}
      </pre>

      <Headers d={d} />
      <Deaths d={d} />
      <Lineage d={d} />
    </section>
  );
}

function Headers({ d }: { d: DL }) {
  const [filter, setFilter] = useState("");
  const [copied, setCopied] = useState(false);
  const all = tablePlain(d.headers);
  const f = filter.trim().toLowerCase();
  const rows = Object.entries(all).filter(
    ([k, v]) => f === "" || k.toLowerCase().includes(f) || plainText(v).toLowerCase().includes(f),
  );
  const copy = async () => {
    try {
      await navigator.clipboard.writeText(JSON.stringify(all, null, 2));
      setCopied(true);
      setTimeout(() => setCopied(false), 2000);
    } catch (err) {
      showError("Copying the headers", err);
    }
  };
  return (
    <>
      <h2>Headers</h2>
      <div class="toolbar">
        <label class="field inline">
          <span>Filter headers</span>
          <input data-testid="header-filter" value={filter} onInput={(e) => setFilter(e.currentTarget.value)} />
        </label>
        <button type="button" data-testid="headers-copy" onClick={copy}>
          {copied ? "Copied" : `Copy ${Object.keys(all).length} headers as JSON`}
        </button>
      </div>
      <table class="table" data-testid="dl-headers">
        <thead>
          <tr>
            <th scope="col">Name</th>
            <th scope="col">Value</th>
          </tr>
        </thead>
        <tbody>
          {rows.map(([k, v]) => (
            <tr key={k} data-testid="header-row" data-name={k}>
              <td class="mono header-name">{k}</td>
              <td class="mono wrap">
                <HeaderText text={plainText(v)} />
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      {rows.length === 0 && <p class="muted">No headers{f ? " match" : ""}.</p>}
    </>
  );
}

/** Characters of a header value shown before "show all". */
const LONG_HEADER = 500;

/** A header value, a long one cut at {@link LONG_HEADER} characters (code
 * points, never half a pair) until asked for whole: a 3,000-character
 * header would push every other header off the screen. */
function HeaderText({ text }: { text: string }) {
  const [whole, setWhole] = useState(false);
  const chars = Array.from(text);
  if (whole || chars.length <= LONG_HEADER) return <>{text}</>;
  return (
    <>
      {chars.slice(0, LONG_HEADER).join("")}…{" "}
      <button type="button" class="link" data-testid="header-more" onClick={() => setWhole(true)}>
        show all {chars.length.toLocaleString("en")} characters
      </button>
    </>
  );
}

function field(o: Plain, k: string): string {
  if (o && typeof o === "object" && !Array.isArray(o) && o[k] !== undefined && o[k] !== null) {
    const v = o[k];
    return Array.isArray(v) ? v.map((x) => plainText(x)).join(", ") : plainText(v);
  }
  return "—";
}

function Deaths({ d }: { d: DL }) {
  const xDeath = tablePlain(d.headers)["x-death"];
  const entries = Array.isArray(xDeath) ? xDeath : [];
  return (
    <>
      <h2>Death history</h2>
      <div data-testid="dl-deaths">
        {d.death ? (
          <p>
            The death that counts: <strong>{d.death.reason}</strong> in queue{" "}
            <span class="mono">{d.death.queue || "—"}</span> from exchange{" "}
            <span class="mono">{d.death.exchange || "(default)"}</span>, routing keys{" "}
            <span class="mono">{d.death.routingKeys.join(", ") || "—"}</span>, {num(d.death.count)} time(s), at{" "}
            {fmtTime(d.death.time)}
            {d.attempts !== undefined && `; ${d.attempts} delivery attempts reported`}.
          </p>
        ) : (
          <p class="muted">Nothing says how it died.</p>
        )}
        {(d.originalExchange || d.originalRoutingKey) && (
          <p>
            Originally published to exchange <span class="mono">{d.originalExchange ?? "—"}</span> with routing key{" "}
            <span class="mono">{d.originalRoutingKey ?? "—"}</span>
            {d.exchangeOnly && " (only the exchange and routing key are known)"}.
          </p>
        )}
        {entries.length > 0 && (
          <table class="table">
            <caption>x-death entries, newest first</caption>
            <thead>
              <tr>
                <th scope="col">Reason</th>
                <th scope="col">Queue</th>
                <th scope="col">Exchange</th>
                <th scope="col">Routing keys</th>
                <th scope="col" class="num">Count</th>
                <th scope="col">Time</th>
              </tr>
            </thead>
            <tbody>
              {entries.map((e, i) => (
                <tr key={i} data-testid="death-row">
                  <td>{field(e, "reason")}</td>
                  <td class="mono">{field(e, "queue")}</td>
                  <td class="mono">{field(e, "exchange")}</td>
                  <td class="mono">{field(e, "routing-keys")}</td>
                  <td class="num">{field(e, "count")}</td>
                  <td>{field(e, "time")}</td>
                </tr>
              ))}
            </tbody>
          </table>
        )}
      </div>
    </>
  );
}

function Lineage({ d }: { d: DL }) {
  return (
    <>
      <h2>Lineage</h2>
      <div data-testid="dl-lineage">
        {d.redrivePlanId && (
          <p class="note" data-testid="dl-redead">
            Re-dead-letter: a replay by plan{" "}
            <a class="mono" href={`#/plans/${encodeURIComponent(d.redrivePlanId)}`}>
              {d.redrivePlanId}
            </a>{" "}
            came back dead-lettered.
          </p>
        )}
        {d.status === DeadLetterStatus.REPLAYED && <p>Replayed: a plan sent this dead letter.</p>}
        <h3>Body revisions</h3>
        {d.revisions.length === 0 ? (
          <p class="muted">Never repaired: the captured body is the one replayed.</p>
        ) : (
          <table class="table">
            <thead>
              <tr>
                <th scope="col">Revision</th>
                <th scope="col">By</th>
                <th scope="col">Reason</th>
                <th scope="col">At</th>
                <th scope="col">sha256</th>
              </tr>
            </thead>
            <tbody>
              {d.revisions.map((r) => (
                <tr key={r.revision} data-testid="revision-row">
                  <td class="num">{r.revision}</td>
                  <td>{r.actor}</td>
                  <td>{r.reason}</td>
                  <td class="nowrap">{fmtTime(r.createdAt)}</td>
                  <td class="mono">{r.bodySha256.slice(0, 16)}…</td>
                </tr>
              ))}
            </tbody>
          </table>
        )}
        {d.archiveHistory.length > 0 && (
          <>
            <h3>Archive history</h3>
            <table class="table">
              <thead>
                <tr>
                  <th scope="col">Action</th>
                  <th scope="col">By</th>
                  <th scope="col">Reason</th>
                  <th scope="col">At</th>
                </tr>
              </thead>
              <tbody>
                {d.archiveHistory.map((a, i) => (
                  <tr key={i}>
                    <td>{a.action}</td>
                    <td>{a.actor}</td>
                    <td>{a.reason}</td>
                    <td class="nowrap">{fmtTime(a.at)}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          </>
        )}
        {d.previousMessageKeys.length > 0 && (
          <p>
            Former message keys:{" "}
            <span class="mono">{d.previousMessageKeys.join(", ")}</span>
          </p>
        )}
      </div>
    </>
  );
}
