// Overview (#/): every source with its DLQ depth, stored and open dead
// letters and arrivals over the last hour; under each, its groups.
import { planner } from "../api";
import { Sparkline } from "../components/Sparkline";
import { SummaryDimension } from "../gen/redrive/v1/planner_pb";
import type { Caller, SourceOverview, SummaryGroup } from "../gen/redrive/v1/planner_pb";
import { clip, fmtTime, num } from "../format";
import { useLoad } from "../hooks";
import { hashWith, navigate } from "../router";

// One summary of every source, grouped by source first, asked for at the
// same time as ListSources: the overview waits for the slower of the two,
// not for both one after the other.
const GROUP_BY = [
  SummaryDimension.SOURCE,
  SummaryDimension.REASON,
  SummaryDimension.PRODUCER,
  SummaryDimension.SCHEMA_VERSION,
  SummaryDimension.ERROR,
];

export function Overview(_: { caller: Caller }) {
  const sources = useLoad("ListSources", () => planner.listSources({}), []);
  const summary = useLoad("SummarizeDeadLetters", () => planner.summarizeDeadLetters({ groupBy: GROUP_BY }), []);
  const list = sources.data?.sources ?? [];
  const groupsOf = (source: string) => (summary.data?.groups ?? []).filter((g) => g.key.source === source);
  return (
    <section>
      <h1>Overview</h1>
      {sources.loading && !sources.data && <p class="muted">Loading…</p>}
      {sources.data && list.length === 0 && <p class="muted">No dead letters were ever stored.</p>}
      {list.length > 0 && (
        <table class="table overview">
          <thead>
            <tr>
              <th scope="col">Source / group</th>
              <th scope="col" class="num">DLQ depth</th>
              <th scope="col" class="num">Stored</th>
              <th scope="col" class="num">Open</th>
              <th scope="col">Arrivals, last hour</th>
              <th scope="col">First seen</th>
              <th scope="col">Last seen</th>
            </tr>
          </thead>
          {list.map((s) => (
            <SourceBlock key={s.source} s={s} groups={groupsOf(s.source)} />
          ))}
        </table>
      )}
    </section>
  );
}

function SourceBlock({ s, groups }: { s: SourceOverview; groups: SummaryGroup[] }) {
  return (
    <tbody>
      <tr class="source-row" data-testid="source-row" data-source={s.source}>
        <th scope="row" class="mono">
          <a href={hashWith("/dead-letters", { source: s.source })}>{s.source}</a>
        </th>
        <td class="num" data-testid="source-depth">
          {s.queueDepth === undefined ? "—" : num(s.queueDepth)}
        </td>
        <td class="num" data-testid="source-stored">
          {num(s.stored)}
        </td>
        <td class="num" data-testid="source-open">
          {num(s.open)}
        </td>
        <td>
          <Sparkline values={s.arrivalsPerMinute} testid="source-arrivals" />
        </td>
        <td colSpan={2} class="muted">
          last arrival {fmtTime(s.lastArrival)}
        </td>
      </tr>
      {groups.map((g, i) => {
        const k = g.key;
        const target = hashWith("/dead-letters", {
          source: s.source,
          reason: k.reason,
          producer: k.producer,
          schema: k.schema_version,
          // The fingerprint selects exactly the group's dead letters.
          group: k.error || undefined,
        });
        return (
          <tr
            key={i}
            class="group-row clickable"
            data-testid="group-row"
            data-source={s.source}
            tabIndex={0}
            onClick={() => navigate(target)}
            onKeyDown={(e) => e.key === "Enter" && navigate(target)}
          >
            <td class="group-key">
              <a href={target} onClick={(e) => e.stopPropagation()}>
                <KeyPart label="reason" value={k.reason} />
                <KeyPart label="producer" value={k.producer} />
                <KeyPart label="schema" value={k.schema_version} />
                <KeyPart label="fingerprint" value={k.error} />
              </a>
              {g.stillArriving && (
                <span class="badge warn" data-testid="group-arriving">
                  still arriving
                </span>
              )}
            </td>
            <td />
            <td class="num" data-testid="group-count">
              {num(g.count)}
            </td>
            <td />
            <td />
            <td data-testid="group-first-seen">{fmtTime(g.firstSeen)}</td>
            <td data-testid="group-last-seen">{fmtTime(g.lastSeen)}</td>
          </tr>
        );
      })}
    </tbody>
  );
}

function KeyPart({ label, value }: { label: string; value: string | undefined }) {
  return (
    <span class="key-part">
      <span class="muted">{label}</span> <span class="mono">{clip(value || "—", 200)}</span>
    </span>
  );
}
