// Dead letters (#/dead-letters?source=…): filters in the hash query, server
// paging (a stack of page tokens), and the precheck of what matches.
import { useState } from "preact/hooks";
import { can, planner } from "../api";
import { ActionButton } from "../components/ActionButton";
import type { Caller } from "../gen/redrive/v1/planner_pb";
import { clip, fmtTime, num } from "../format";
import { useLoad } from "../hooks";
import { hashWith, navigate } from "../router";
import {
  filterProblems,
  filtersFromQuery,
  parseBodyMatch,
  selectorFrom,
  type FilterKey,
  type Filters,
} from "../selector";

const PAGE_SIZE = 50;

const INPUTS: { key: FilterKey; label: string; testid: string; type?: string; placeholder?: string }[] = [
  { key: "source", label: "Source", testid: "filter-source" },
  { key: "reason", label: "Reason", testid: "filter-reason", placeholder: "rejected, expired, maxlen…" },
  { key: "producer", label: "Producer", testid: "filter-producer" },
  { key: "schema", label: "Schema version", testid: "filter-schema-version" },
  { key: "group", label: "Error fingerprint", testid: "filter-group", placeholder: "rejected: Timeout after <n> ms" },
  { key: "error", label: "Error contains", testid: "filter-error" },
  { key: "from", label: "Died from (UTC)", testid: "filter-from", type: "datetime-local" },
  { key: "to", label: "Died before (UTC)", testid: "filter-to", type: "datetime-local" },
  { key: "body", label: "Body match (path=value)", testid: "filter-body", placeholder: "/order/status=paid" },
  { key: "status", label: "Status", testid: "filter-status", type: "select" },
];

export function DeadLetters({ caller, query }: { caller: Caller; query: URLSearchParams }) {
  // The screen is keyed by its query (main.tsx): new filters start it over.
  const applied = filtersFromQuery(query);
  const appliedKey = JSON.stringify(applied);
  const [form, setForm] = useState<Filters>(applied);
  // tokens[i] is the token of page i; the last one is the page shown.
  const [tokens, setTokens] = useState<string[]>([""]);
  const token = tokens[tokens.length - 1];
  const selector = selectorFrom(applied);
  // A filter of the link that cannot be read stops the screen: dropping it
  // would list, count and precheck more than was asked for.
  const problems = filterProblems(applied);
  const refused = () => Promise.reject(new Error(`the filters cannot be read: ${problems.join("; ")}`));

  const page = useLoad(
    "ListDeadLetters",
    () =>
      problems.length > 0
        ? refused()
        : planner.listDeadLetters({ selector, pageSize: PAGE_SIZE, pageToken: token }),
    [appliedKey, token],
  );
  const summary = useLoad(
    "SummarizeDeadLetters",
    () => (problems.length > 0 ? refused() : planner.summarizeDeadLetters({ selector })),
    [appliedKey],
  );
  const total = problems.length > 0 ? undefined : summary.data?.total;

  const bodyInvalid = form.body.trim() !== "" && parseBodyMatch(form.body) === null;
  const apply = (e: Event) => {
    e.preventDefault();
    if (bodyInvalid) return;
    const target = hashWith("/dead-letters", form);
    if (target === window.location.hash) {
      // The same filters again: look again.
      setTokens([""]);
      page.reload();
      summary.reload();
    } else {
      navigate(target);
    }
  };

  return (
    <section>
      <h1>Dead letters</h1>
      <form class="filters" onSubmit={apply} aria-label="Filters">
        {INPUTS.map((i) => (
          <label class="field" key={i.key}>
            <span>{i.label}</span>
            {i.type === "select" ? (
              <select
                data-testid={i.testid}
                value={form[i.key]}
                onChange={(e) => setForm({ ...form, [i.key]: e.currentTarget.value })}
              >
                <option value="">not archived</option>
                <option value="open">open (not replayed yet)</option>
                <option value="replayed">replayed</option>
                <option value="archived">archived</option>
                <option value="all">all</option>
              </select>
            ) : (
              <input
                type={i.type ?? "text"}
                data-testid={i.testid}
                placeholder={i.placeholder}
                value={form[i.key]}
                aria-invalid={i.key === "body" && bodyInvalid}
                onInput={(e) => setForm({ ...form, [i.key]: e.currentTarget.value })}
              />
            )}
          </label>
        ))}
        <div class="filter-buttons">
          <button type="submit" class="primary" data-testid="filter-apply" disabled={bodyInvalid}>
            Apply filters
          </button>
          {bodyInvalid && <span class="invalid">Body match needs path=value</span>}
        </div>
      </form>

      <div class="toolbar">
        {problems.length > 0 && (
          <span class="invalid" data-testid="filter-problems">
            Not listed: {problems.join("; ")}
          </span>
        )}
        <span data-testid="dl-total">{total === undefined ? "…" : `${num(total)} matching dead letters`}</span>
        {can(caller, "RunPrecheck") && total !== undefined && (
          <ActionButton
            testid="precheck-run"
            what="RunPrecheck"
            primary
            label={`Precheck the ${num(total)} matching dead letters`}
            disabled={total === 0n}
            dialog={{
              title: "Run a precheck",
              count: `${num(total)} dead letters`,
              body: <p>The precheck reads every matching dead letter and gives each a verdict; nothing is sent.</p>,
              confirmLabel: `Precheck ${num(total)} dead letters`,
            }}
            run={async () => {
              const r = await planner.runPrecheck({ selector });
              navigate(`#/prechecks/${encodeURIComponent(r.precheckId)}`);
            }}
          />
        )}
      </div>

      <table class="table">
        <thead>
          <tr>
            <th scope="col">Id</th>
            <th scope="col">Message id</th>
            <th scope="col">Source</th>
            <th scope="col">Reason</th>
            <th scope="col">Error</th>
            <th scope="col">Died at</th>
          </tr>
        </thead>
        <tbody>
          {page.data?.deadLetters.map((d) => {
            const href = `#/dead-letters/${encodeURIComponent(d.id)}`;
            return (
              <tr
                key={d.id}
                class="clickable"
                data-testid="dl-row"
                data-id={d.id}
                tabIndex={0}
                onClick={() => navigate(href)}
                onKeyDown={(e) => e.key === "Enter" && navigate(href)}
              >
                <td class="mono">
                  <a href={href} onClick={(e) => e.stopPropagation()}>
                    {d.id}
                  </a>
                </td>
                <td class="mono">{d.messageId ?? "—"}</td>
                <td class="mono">{d.source}</td>
                <td class="nowrap">{d.death?.reason || "—"}</td>
                <td class="error-text">{clip(d.errorText ?? "")}</td>
                <td class="nowrap">{fmtTime(d.diedAt)}</td>
              </tr>
            );
          })}
        </tbody>
      </table>
      {page.data && page.data.deadLetters.length === 0 && <p class="muted">No dead letters match.</p>}
      <div class="pager">
        <button
          type="button"
          data-testid="prev-page"
          disabled={tokens.length <= 1 || page.loading}
          onClick={() => setTokens(tokens.slice(0, -1))}
        >
          ← Previous page
        </button>
        <span class="muted">page {tokens.length}</span>
        <button
          type="button"
          data-testid="next-page"
          disabled={!page.data?.nextPageToken || page.loading}
          onClick={() => page.data && setTokens([...tokens, page.data.nextPageToken])}
        >
          Next page →
        </button>
      </div>
    </section>
  );
}
