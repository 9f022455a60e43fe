// Repair (#/dead-letters/<id>/repair): the body as it is on the left, an
// editor on the right, a JSON check, a line diff and a required reason.
// RepairDeadLetter stores a new revision; the captured body stays.
import { useMemo, useRef, useState } from "preact/hooks";
import { can, planner } from "../api";
import { showError } from "../errors";
import { BodyCompression } from "../gen/redrive/v1/messages_pb";
import type { Caller } from "../gen/redrive/v1/planner_pb";
import { diffRows } from "../components/LineDiff";
import { isJsonType, utf8 } from "../format";
import { useLoad } from "../hooks";
import { navigate } from "../router";
import { latestBody } from "./DeadLetter";

export function Repair({ caller, id }: { caller: Caller; id: string }) {
  const res = useLoad("GetDeadLetter", () => planner.getDeadLetter({ id }), [id]);
  const d = res.data?.deadLetter;
  if (!d) return <section>{res.loading ? <p class="muted">Loading…</p> : <h1>Repair dead letter {id}</h1>}</section>;
  const original = utf8(latestBody(d));
  const compressed = d.bodyCompression === BodyCompression.GZIP || d.bodyCompression === BodyCompression.ZSTD;
  return (
    <section>
      <h1>
        Repair dead letter <a class="mono" href={`#/dead-letters/${encodeURIComponent(d.id)}`}>{d.id}</a>
      </h1>
      {!can(caller, "RepairDeadLetter") && <p class="note">Your roles do not allow repairs (operator needed).</p>}
      {original === null || compressed ? (
        <p class="note">
          This body is {compressed ? "compressed" : "not UTF-8 text"}; the console edits text bodies only.
        </p>
      ) : (
        <Editor
          id={d.id}
          original={original}
          json={isJsonType(d.properties?.contentType)}
          allowed={can(caller, "RepairDeadLetter")}
        />
      )}
    </section>
  );
}

function Editor({ id, original, json, allowed }: { id: string; original: string; json: boolean; allowed: boolean }) {
  const [text, setText] = useState(original);
  const [reason, setReason] = useState("");
  const [busy, setBusy] = useState(false);
  const once = useRef(false);
  const parseError = useMemo(() => {
    if (!json) return null;
    try {
      JSON.parse(text);
      return null;
    } catch (e) {
      return e instanceof Error ? e.message : String(e);
    }
  }, [text, json]);
  const rows = useMemo(() => diffRows(original, text), [original, text]);
  const unchanged = text === original;
  const ready = allowed && reason.trim() !== "" && parseError === null && !unchanged && !busy;

  const submit = async () => {
    if (once.current || !ready) return;
    once.current = true;
    setBusy(true);
    try {
      await planner.repairDeadLetter({
        deadLetterId: id,
        newBody: new TextEncoder().encode(text),
        reason: reason.trim(),
      });
      navigate(`#/dead-letters/${encodeURIComponent(id)}`);
    } catch (err) {
      showError("RepairDeadLetter", err);
      once.current = false;
      setBusy(false);
    }
  };

  return (
    <>
      <div class="repair-panes">
        <label class="field">
          <span>Current body (read-only)</span>
          <textarea class="mono" rows={18} readOnly value={original} data-testid="repair-original" />
        </label>
        <label class="field">
          <span>Repaired body</span>
          <textarea
            class="mono"
            rows={18}
            spellcheck={false}
            data-testid="repair-editor"
            value={text}
            onInput={(e) => setText(e.currentTarget.value)}
          />
        </label>
      </div>
      {json && (
        <p class={parseError ? "invalid" : "valid"} data-testid="repair-json-status" role="status">
          {parseError ? `invalid JSON: ${parseError}` : "valid JSON"}
        </p>
      )}
      <h2>Changes</h2>
      <table class="table diff mono" data-testid="repair-diff">
        <thead>
          <tr>
            <th scope="col">Current</th>
            <th scope="col">Repaired</th>
          </tr>
        </thead>
        <tbody>{rows}</tbody>
      </table>
      {unchanged && <p class="muted">No changes yet: a revision must differ from the current body.</p>}
      <label class="field">
        <span>Reason for the repair (required; shown with the revision and in the replay's audit)</span>
        <input data-testid="repair-reason" value={reason} onInput={(e) => setReason(e.currentTarget.value)} />
      </label>
      <button type="button" class="primary" data-testid="repair-submit" disabled={!ready} onClick={submit}>
        Store the repaired body as a new revision of 1 dead letter
      </button>
    </>
  );
}
