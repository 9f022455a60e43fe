// Turning protobuf values into text for people: times, durations, counts,
// AMQP header values, bodies.
import { timestampDate, type Duration, type Timestamp } from "@bufbuild/protobuf/wkt";
import {
  AuditAction,
  BodyCompression,
  PlanState,
  Verdict,
  type HeaderTable,
  type HeaderValue,
} from "./gen/redrive/v1/messages_pb";

export function tsDate(ts: Timestamp | undefined): Date | null {
  if (!ts) return null;
  return timestampDate(ts);
}

/** "2026-12-03 16:01:44Z" (UTC), or "—". */
export function fmtTime(ts: Timestamp | undefined): string {
  const d = tsDate(ts);
  if (!d) return "—";
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export function durationMs(d: Duration | undefined): number {
  if (!d) return 0;
  return Number(d.seconds) * 1000 + Math.floor(d.nanos / 1e6);
}

/** "1h 4m 12s", "4m 12s", "12s". */
export function fmtSpan(ms: number): string {
  let s = Math.max(0, Math.floor(ms / 1000));
  const h = Math.floor(s / 3600);
  s -= h * 3600;
  const m = Math.floor(s / 60);
  s -= m * 60;
  if (h > 0) return `${h}h ${m}m ${s}s`;
  if (m > 0) return `${m}m ${s}s`;
  return `${s}s`;
}

/** A fraction as a percentage with at most two decimals (`0.015` → `1.5%`);
 * one above zero that rounds to none is `<0.01%`, never `0.00%` (the same
 * rule as redrivectl's plan status). */
export function fractionPercent(fraction: number): string {
  const percent = Math.round(fraction * 10_000) / 100;
  if (percent === 0 && fraction > 0) return "<0.01%";
  return `${percent}%`;
}

/** The canary's true share of the items, and the fraction asked for when
 * rounding up to whole items (at least one) made it another:
 * `1 item (25% of the items; asked 1%, rounded up to whole items)`. */
export function canaryText(canaryItems: bigint, totalItems: bigint, asked: number): string {
  const askedText = fractionPercent(asked);
  const share = totalItems === 0n ? askedText : fractionPercent(Number(canaryItems) / Number(totalItems));
  const items = `${canaryItems} ${canaryItems === 1n ? "item" : "items"}`;
  return share === askedText
    ? `${items} (${share} of the items)`
    : `${items} (${share} of the items; asked ${askedText}, rounded up to whole items)`;
}

export function num(n: bigint | number | undefined): string {
  return n === undefined ? "—" : n.toString();
}

// Enum names as the API's words: VERDICT_ALREADY_REPLAYED → already_replayed.
export function verdictName(v: Verdict): string {
  return (Verdict[v] ?? String(v)).toLowerCase();
}

export function actionName(a: AuditAction): string {
  return (AuditAction[a] ?? String(a)).replace(/([a-z])([A-Z])/g, "$1_$2").toLowerCase();
}

const STATE_NAMES: Record<number, string> = {
  [PlanState.UNSPECIFIED]: "unknown",
  [PlanState.AWAITING_APPROVAL]: "awaiting approval",
  [PlanState.CANARY]: "canary",
  [PlanState.OBSERVING]: "observing",
  [PlanState.MAIN]: "main",
  [PlanState.COMPLETED]: "completed",
  [PlanState.PAUSED]: "paused",
  [PlanState.CANCELLED]: "cancelled",
  [PlanState.ABORTED]: "aborted",
};

export function stateName(s: PlanState): string {
  return STATE_NAMES[s] ?? String(s);
}

export function isFinal(s: PlanState): boolean {
  return s === PlanState.COMPLETED || s === PlanState.CANCELLED || s === PlanState.ABORTED;
}

export function hex(bytes: Uint8Array, max = bytes.length): string {
  const out: string[] = [];
  const n = Math.min(max, bytes.length);
  for (let i = 0; i < n; i += 16) {
    const row = Array.from(bytes.subarray(i, Math.min(i + 16, n)), (b) => b.toString(16).padStart(2, "0"));
    out.push(`${i.toString(16).padStart(8, "0")}  ${row.join(" ")}`);
  }
  if (n < bytes.length) out.push(`… ${bytes.length - n} more bytes`);
  return out.join("\n");
}

/** UTF-8 text, or null when the bytes are not valid UTF-8. */
export function utf8(bytes: Uint8Array): string | null {
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    return null;
  }
}

export type Plain = null | boolean | number | string | Plain[] | { [k: string]: Plain };

/** A typed AMQP header value as plain JSON-able data. */
export function headerPlain(v: HeaderValue | undefined): Plain {
  const val = v?.value;
  if (!val || val.case === undefined) return null;
  switch (val.case) {
    case "boolean":
    case "shortShortInt":
    case "shortShortUint":
    case "shortInt":
    case "shortUint":
    case "longInt":
    case "longUint":
    case "float":
    case "double":
    case "shortString":
      return val.value;
    case "longLongInt":
    case "timestamp": {
      const n = val.value;
      if (val.case === "timestamp") return epochText(n);
      return n >= BigInt(Number.MIN_SAFE_INTEGER) && n <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(n) : n.toString();
    }
    case "decimal": {
      const { scale, value } = val.value;
      return scale === 0 ? String(value) : (value / 10 ** scale).toFixed(scale);
    }
    case "longString":
      return utf8(val.value) ?? `0x${hex(val.value).replace(/^\S+\s+/gm, "").replace(/\s/g, "")}`;
    case "byteArray":
      return `0x${Array.from(val.value, (b) => b.toString(16).padStart(2, "0")).join("")}`;
    case "array":
      return val.value.values.map(headerPlain);
    case "table":
      return tablePlain(val.value);
    case "void":
      return null;
  }
  return null;
}

/** The units a count since 1970 is read in, by range, as the planner's
 * capture reads it (redrive_proto::time::from_epoch_by_range): the one in
 * which it falls in 1990..2200. */
const EPOCH_UNITS: [string, bigint][] = [
  ["seconds", 1n],
  ["milliseconds", 1_000n],
  ["microseconds", 1_000_000n],
  ["nanoseconds", 1_000_000_000n],
];
const PLAUSIBLE_FROM = 631_152_000n;
const PLAUSIBLE_UNTIL = 7_258_118_400n;

/** An AMQP timestamp as a time: seconds as AMQP specifies, else the unit
 * its range says (`… (read as milliseconds)`), else the number. */
export function epochText(n: bigint): string {
  for (const [name, per] of EPOCH_UNITS) {
    if (n >= PLAUSIBLE_FROM * per && n < PLAUSIBLE_UNTIL * per) {
      const at = new Date(Number((n * 1000n) / per)).toISOString();
      return name === "seconds" ? at : `${at} (read as ${name})`;
    }
  }
  return n.toString();
}

export function tablePlain(t: HeaderTable | undefined): { [k: string]: Plain } {
  const out: { [k: string]: Plain } = {};
  if (!t) return out;
  for (const k of Object.keys(t.fields).sort()) out[k] = headerPlain(t.fields[k]);
  return out;
}

/** One header value as a table cell: strings as they are, the rest as JSON. */
export function plainText(p: Plain): string {
  return typeof p === "string" ? p : JSON.stringify(p);
}

export interface RenderedBody {
  text: string;
  kind: "json" | "text" | "hex" | "preview";
  note?: string;
}

/**
 * The body as a person reads it, by content type: JSON pretty-printed, text
 * as text, binary as hex; a compressed body is the server's decompressed
 * preview, with a note.
 */
export function renderBody(
  body: Uint8Array,
  contentType: string | undefined,
  compression: BodyCompression,
  preview: string,
): RenderedBody {
  if (compression === BodyCompression.GZIP || compression === BodyCompression.ZSTD) {
    const name = compression === BodyCompression.GZIP ? "gzip" : "zstd";
    return { text: preview, kind: "preview", note: `${name} body shown decompressed` };
  }
  const text = utf8(body);
  if (text === null) return { text: hex(body, 64 * 1024), kind: "hex", note: "binary body shown as hex" };
  if (isJsonType(contentType) || /^\s*[[{]/.test(text)) {
    try {
      JSON.parse(text);
      return { text: reindentJson(text), kind: "json" };
    } catch {
      // Not JSON after all: shown as it is.
    }
  }
  return { text, kind: "text" };
}

/**
 * `text`, valid JSON, re-indented two spaces a level (as
 * `JSON.stringify(value, null, 2)` lays it out) with every token exactly
 * as written: parsing and printing again would turn 12345678901234567891
 * into 12345678901234567000 and 12.0 into 12, and a person copies an order
 * id from this view.
 */
export function reindentJson(text: string): string {
  let out = "";
  let depth = 0;
  let i = 0;
  const n = text.length;
  const newline = () => "\n" + "  ".repeat(depth);
  while (i < n) {
    const c = text[i];
    if (c === '"') {
      let j = i + 1;
      while (j < n && text[j] !== '"') j += text[j] === "\\" ? 2 : 1;
      out += text.slice(i, j + 1);
      i = j + 1;
    } else if (c === " " || c === "\t" || c === "\n" || c === "\r") {
      i++;
    } else if (c === "{" || c === "[") {
      const close = c === "{" ? "}" : "]";
      let j = i + 1;
      while (j < n && " \t\n\r".includes(text[j])) j++;
      if (text[j] === close) {
        out += c + close;
        i = j + 1;
      } else {
        depth++;
        out += c + newline();
        i++;
      }
    } else if (c === "}" || c === "]") {
      depth--;
      out += newline() + c;
      i++;
    } else if (c === ",") {
      out += "," + newline();
      i++;
    } else if (c === ":") {
      out += ": ";
      i++;
    } else {
      // A number, true, false or null: up to the next delimiter.
      let j = i;
      while (j < n && !" \t\n\r,:]}".includes(text[j])) j++;
      out += text.slice(i, j);
      i = j;
    }
  }
  return out;
}

export function isJsonType(contentType: string | undefined): boolean {
  return !!contentType && /json/i.test(contentType);
}

/**
 * `text` cut to `max` characters with an ellipsis: a listing shows the
 * start of a long value (the dead letter's own screen shows all of it).
 */
export function clip(text: string, max = 300): string {
  return text.length > max ? `${text.slice(0, max)}…` : text;
}
