// The confirm dialog every action goes through: an in-page div (never
// window.confirm), repeating the count acted on, with a reason when the call
// records one, and, for large approvals, the count typed back.
import type { ComponentChildren } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";

export interface DialogSpec {
  title: string;
  /** The count acted on, repeated: "42 items". */
  count: string;
  /** What happens, in a sentence. */
  body?: ComponentChildren;
  confirmLabel: string;
  /** A reason is required (and passed to onConfirm). */
  needsReason?: boolean;
  /** The person must type this number before confirming. */
  typedCount?: string;
  /** The action cannot be undone: its button is red. */
  danger?: boolean;
}

interface Props extends DialogSpec {
  onConfirm: (reason: string) => void;
  onCancel: () => void;
}

export function Dialog(p: Props) {
  const [reason, setReason] = useState("");
  const [typed, setTyped] = useState("");
  const [clicked, setClicked] = useState(false);
  // Guards a double click that lands before the disabled attribute renders.
  const once = useRef(false);
  const box = useRef<HTMLDivElement>(null);
  useEffect(() => {
    // Focus the first field (or Back): the keyboard starts in the dialog.
    box.current?.querySelector<HTMLElement>("textarea, input, [data-testid=dialog-cancel]")?.focus();
  }, []);
  const valid =
    (!p.needsReason || reason.trim() !== "") && (p.typedCount === undefined || typed.trim() === p.typedCount);
  const confirm = () => {
    if (once.current || !valid) return;
    once.current = true;
    setClicked(true);
    p.onConfirm(reason.trim());
  };
  return (
    <div class="backdrop">
      <div
        class="dialog"
        role="dialog"
        aria-modal="true"
        aria-labelledby="dialog-title"
        data-testid="dialog"
        ref={box}
        onKeyDown={(e) => e.key === "Escape" && p.onCancel()}
      >
        <h2 id="dialog-title">{p.title}</h2>
        <p class="dialog-count" data-testid="dialog-count">
          {p.count}
        </p>
        {p.body && <div class="dialog-body">{p.body}</div>}
        {p.needsReason && (
          <label class="field">
            <span>Reason (recorded in the audit)</span>
            <textarea
              data-testid="dialog-reason"
              rows={3}
              value={reason}
              onInput={(e) => setReason(e.currentTarget.value)}
            />
          </label>
        )}
        {p.typedCount !== undefined && (
          <label class="field">
            <span>Type the item count ({p.typedCount}) to confirm</span>
            <input
              data-testid="approve-count-input"
              inputMode="numeric"
              autoComplete="off"
              value={typed}
              onInput={(e) => setTyped(e.currentTarget.value)}
            />
          </label>
        )}
        <div class="dialog-buttons">
          <button type="button" data-testid="dialog-cancel" onClick={p.onCancel}>
            Back
          </button>
          <button
            type="button"
            class={p.danger ? "danger" : "primary"}
            data-testid="dialog-confirm"
            disabled={clicked || !valid}
            onClick={confirm}
          >
            {p.confirmLabel}
          </button>
        </div>
      </div>
    </div>
  );
}
