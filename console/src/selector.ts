// The dead-letter filters as they travel in the hash query, and the Selector
// they make.
import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { BodyMatchSchema, DeadLetterStatus, SelectorSchema, type Selector } from "./gen/redrive/v1/messages_pb";

export const FILTER_KEYS = ["source", "reason", "producer", "schema", "group", "error", "from", "to", "body", "status"] as const;

/** The `status` filter's values, as `redrivectl dead-letters list --status`
 * takes them; empty: everything not archived (the API's default). */
export const STATUSES: Record<string, DeadLetterStatus> = {
  open: DeadLetterStatus.OPEN,
  replayed: DeadLetterStatus.REPLAYED,
  archived: DeadLetterStatus.ARCHIVED,
  all: DeadLetterStatus.ALL,
};
export type FilterKey = (typeof FILTER_KEYS)[number];
export type Filters = Record<FilterKey, string>;

export function filtersFromQuery(q: URLSearchParams): Filters {
  const f = {} as Filters;
  for (const k of FILTER_KEYS) f[k] = q.get(k) ?? "";
  return f;
}

/** `/order/id=42` → pointer `/order/id`, value `42`; `order.id=42` → `/order/id`. */
export function parseBodyMatch(s: string): { pointer: string; value: string } | null {
  const eq = s.indexOf("=");
  if (eq < 0) return null;
  let path = s.slice(0, eq).trim();
  const value = s.slice(eq + 1).trim();
  if (path !== "" && !path.startsWith("/")) path = "/" + path.split(".").join("/");
  return { pointer: path, value };
}

/** A time as the filters take it: "2026-12-03T16:00" (a datetime-local
 * value, seconds optional) read as UTC, like every time the console shows,
 * or with its own `Z` or `±hh:mm`. Never the browser's zone: a link must
 * select the same dead letters wherever it is opened. */
export function utcTime(s: string) {
  const m = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d{1,3})?)?(Z|[+-]\d{2}:\d{2})?$/.exec(s.trim());
  if (!m) return undefined;
  const d = new Date(m[3] ? s.trim() : `${s.trim()}Z`);
  return isNaN(d.getTime()) ? undefined : timestampFromDate(d);
}

/**
 * What in `f` cannot be read (a time that is no time, a body match without
 * `=`): a link with such a filter must not quietly select more.
 */
export function filterProblems(f: Filters): string[] {
  const problems: string[] = [];
  if (f.from && !utcTime(f.from)) problems.push(`from: ${JSON.stringify(f.from)} is not a date and time`);
  if (f.to && !utcTime(f.to)) problems.push(`to: ${JSON.stringify(f.to)} is not a date and time`);
  if (f.body && !parseBodyMatch(f.body)) problems.push(`body: ${JSON.stringify(f.body)} needs path=value`);
  if (f.status && !(f.status in STATUSES))
    problems.push(`status: ${JSON.stringify(f.status)} is none of ${Object.keys(STATUSES).join(", ")}`);
  return problems;
}

/** The selector of `f`; read `filterProblems(f)` first. */
export function selectorFrom(f: Filters): Selector {
  const sel = create(SelectorSchema, {});
  if (f.source) sel.sources = [f.source];
  if (f.reason) sel.reasons = [f.reason];
  if (f.producer) sel.producers = [f.producer];
  if (f.schema) sel.schemaVersions = [f.schema];
  if (f.group) sel.errorGroups = [f.group];
  if (f.error) sel.errorContains = f.error;
  if (f.from) sel.diedFrom = utcTime(f.from);
  if (f.to) sel.diedTo = utcTime(f.to);
  if (f.status && f.status in STATUSES) sel.status = STATUSES[f.status];
  if (f.body) {
    const m = parseBodyMatch(f.body);
    if (m) sel.bodyMatches = [create(BodyMatchSchema, m)];
  }
  return sel;
}
