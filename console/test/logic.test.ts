import assert from "node:assert/strict";
import { test } from "node:test";
import { create } from "@bufbuild/protobuf";
import { actionMethod, actionWords } from "../src/actions";
import { lineDiff } from "../src/diff";
import { BodyCompression, HeaderTableSchema } from "../src/gen/redrive/v1/messages_pb";
import { canaryText, epochText, fmtSpan, fractionPercent, headerPlain, reindentJson, renderBody, tablePlain } from "../src/format";
import { GATE_ACTOR, gateTrips } from "../src/gates";
import { OperatorActionSchema } from "../src/gen/redrive/v1/messages_pb";
import { parseBodyMatch, selectorFrom, filtersFromQuery, filterProblems } from "../src/selector";

const enc = new TextEncoder();

test("lineDiff pairs a changed line and keeps the rest", () => {
  const rows = lineDiff("a\nb\nc", "a\nB\nc\nd");
  assert.deepEqual(
    rows.map((r) => r.kind),
    ["same", "changed", "same", "added"],
  );
  assert.equal(rows[1].left, "b");
  assert.equal(rows[1].right, "B");
});

test("lineDiff of equal texts is all same", () => {
  assert.ok(lineDiff("x\ny", "x\ny").every((r) => r.kind === "same"));
});

test("body match: pointer or dotted path, value after the first =", () => {
  assert.deepEqual(parseBodyMatch("/order/status=paid"), { pointer: "/order/status", value: "paid" });
  assert.deepEqual(parseBodyMatch("order.id=a=b"), { pointer: "/order/id", value: "a=b" });
  assert.deepEqual(parseBodyMatch("=42"), { pointer: "", value: "42" });
  assert.equal(parseBodyMatch("no equals"), null);
});

test("an error fingerprint selects its group exactly", () => {
  const q = new URLSearchParams({ source: "orders.dlq", group: "rejected: Timeout after <n> ms" });
  const sel = selectorFrom(filtersFromQuery(q));
  assert.deepEqual(sel.errorGroups, ["rejected: Timeout after <n> ms"]);
  assert.equal(sel.errorContains, "");
});

test("filters from the hash query make the selector", () => {
  const q = new URLSearchParams("source=orders.dlq&reason=rejected&error=timeout&body=%2Fa%3D1");
  const sel = selectorFrom(filtersFromQuery(q));
  assert.deepEqual(sel.sources, ["orders.dlq"]);
  assert.deepEqual(sel.reasons, ["rejected"]);
  assert.equal(sel.errorContains, "timeout");
  assert.equal(sel.bodyMatches[0].pointer, "/a");
  assert.equal(sel.bodyMatches[0].value, "1");
  assert.deepEqual(sel.producers, []);
});

test("header values become plain data, bytes as text", () => {
  const t = create(HeaderTableSchema, {
    fields: {
      n: { value: { case: "longLongInt", value: 2n } },
      s: { value: { case: "longString", value: enc.encode("<img onerror=x>") } },
      a: { value: { case: "array", value: { values: [{ value: { case: "boolean", value: true } }] } } },
      d: { value: { case: "decimal", value: { scale: 2, value: 1234 } } },
    },
  });
  assert.deepEqual(tablePlain(t), { a: [true], d: "12.34", n: 2, s: "<img onerror=x>" });
  assert.equal(headerPlain(undefined), null);
});

test("bodies render by content type", () => {
  const json = renderBody(enc.encode('{"a":1}'), "application/json", BodyCompression.NONE, "");
  assert.equal(json.kind, "json");
  assert.equal(json.text, '{\n  "a": 1\n}');
  const bin = renderBody(new Uint8Array([0xff, 0x00]), "application/octet-stream", BodyCompression.NONE, "");
  assert.equal(bin.kind, "hex");
  assert.match(bin.text, /ff 00/);
  const gz = renderBody(new Uint8Array([0x1f, 0x8b]), "application/json", BodyCompression.GZIP, "{}");
  assert.equal(gz.text, "{}");
  assert.equal(gz.note, "gzip body shown decompressed");
});

test("spans read as people say them", () => {
  assert.equal(fmtSpan(252_000), "4m 12s");
  assert.equal(fmtSpan(3_725_000), "1h 2m 5s");
  assert.equal(fmtSpan(-5), "0s");
});

test("gate trips are the gates' pauses and aborts, not their promotions or an operator's pause", () => {
  const action = (actor: string, action: string) => create(OperatorActionSchema, { actor, action, reason: action });
  const actions = [
    action("alice", "approve"),
    action(GATE_ACTOR, "next_wave"),
    action(GATE_ACTOR, "promote"),
    action(GATE_ACTOR, "pause"),
    action("alice", "pause"),
    action("alice", "resume"),
    action(GATE_ACTOR, "abort"),
  ];
  assert.deepEqual(
    gateTrips(actions).map((a) => `${a.actor} ${a.action}`),
    [`${GATE_ACTOR} pause`, `${GATE_ACTOR} abort`],
  );
  assert.deepEqual(gateTrips(actions.slice(0, 3)), []);
});

test("a canary's share: the true one, never 0.00% for a tiny fraction", () => {
  assert.equal(fractionPercent(0.015), "1.5%");
  assert.equal(fractionPercent(1), "100%");
  assert.equal(fractionPercent(1e-300), "<0.01%");
  assert.equal(fractionPercent(0.00004), "<0.01%");
  assert.equal(fractionPercent(0.00005), "0.01%");
  assert.equal(canaryText(100n, 10_000n, 0.01), "100 items (1% of the items)");
  assert.equal(
    canaryText(1n, 4n, 0.01),
    "1 item (25% of the items; asked 1%, rounded up to whole items)",
  );
  assert.equal(
    canaryText(1n, 1_000_000n, 1e-300),
    "1 item (<0.01% of the items)",
  );
  assert.equal(canaryText(0n, 0n, 0.05), "0 items (5% of the items)");
});

test("a JSON body is re-indented with every token as written", () => {
  const body = '{"customer_id": 12345678901234567891, "price": 1.10,"amount":12.0,"e":1E+2,' +
    '"s":"a\\"b,{[:","n":null,"t":true,"empty":{},"list":[ ],"deep":[{"x":-0.0}]}';
  const shown = reindentJson(body);
  assert.equal(
    shown,
    [
      "{",
      '  "customer_id": 12345678901234567891,',
      '  "price": 1.10,',
      '  "amount": 12.0,',
      '  "e": 1E+2,',
      '  "s": "a\\"b,{[:",',
      '  "n": null,',
      '  "t": true,',
      '  "empty": {},',
      '  "list": [],',
      '  "deep": [',
      "    {",
      '      "x": -0.0',
      "    }",
      "  ]",
      "}",
    ].join("\n"),
  );
  // Where no token is rewritten, the layout is JSON.stringify's own.
  const plain = '{"a":[1,2,{"b":"c"}],"d":{}}';
  assert.equal(reindentJson(plain), JSON.stringify(JSON.parse(plain), null, 2));
  const rendered = renderBody(enc.encode(body), "application/json", BodyCompression.NONE, "");
  assert.equal(rendered.kind, "json");
  assert.ok(rendered.text.includes("12345678901234567891"), rendered.text);
});

test("filter times are UTC wherever the browser is", (t) => {
  const zone = process.env.TZ;
  t.after(() => {
    if (zone === undefined) delete process.env.TZ;
    else process.env.TZ = zone;
  });
  process.env.TZ = "Asia/Tokyo";
  assert.equal(new Date(2026, 0, 1).getTimezoneOffset(), -540, "the zone took");
  const at = (from: string) => selectorFrom(filtersFromQuery(new URLSearchParams({ from }))).diedFrom?.seconds;
  const expected = BigInt(Date.UTC(2026, 11, 6, 6, 0) / 1000);
  assert.equal(at("2026-12-06T06:00"), expected);
  assert.equal(at("2026-12-06T06:00:00Z"), expected);
  assert.equal(at("2026-12-06T15:00+09:00"), expected);
  for (const bad of ["yesterday", "2026-12-06", "2026-12-06T06:00+0900", "2026-12-06t06:00z"]) {
    assert.equal(at(bad), undefined, bad);
    assert.equal(filterProblems(filtersFromQuery(new URLSearchParams({ from: bad }))).length, 1, bad);
  }
});

test("the status filter is the CLI's, and an unknown one lists nothing", () => {
  const sel = (status: string) => selectorFrom(filtersFromQuery(new URLSearchParams({ status })));
  assert.equal(sel("open").status, 1);
  assert.equal(sel("replayed").status, 3);
  assert.equal(sel("").status, 0, "empty: the API's default, everything not archived");
  const problems = filterProblems(filtersFromQuery(new URLSearchParams({ status: "opened" })));
  assert.deepEqual(problems, ['status: "opened" is none of open, replayed, archived, all']);
});

test("a timestamp header is read in the unit its range says", () => {
  assert.equal(epochText(1_700_000_000n), "2023-11-14T22:13:20.000Z");
  assert.equal(epochText(1_700_000_000_123n), "2023-11-14T22:13:20.123Z (read as milliseconds)");
  assert.equal(epochText(1_700_000_000_123_456n), "2023-11-14T22:13:20.123Z (read as microseconds)");
  assert.equal(epochText(12_345n), "12345");
});

test("the error box names what failed in words, keeping the method for reports", () => {
  assert.equal(actionWords("ApprovePlan"), "Approving the plan");
  assert.equal(actionWords("WatchPlan"), "Following the plan live");
  assert.equal(actionMethod("ApprovePlan"), "redrive.v1.Planner/ApprovePlan");
  // Already words: shown as given, no method.
  assert.equal(actionWords("Copying the headers"), "Copying the headers");
  assert.equal(actionMethod("Copying the headers"), undefined);
});
