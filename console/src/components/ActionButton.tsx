// A button that acts: it names the count it acts on, opens a Dialog, calls
// once, and stays disabled while the call is in flight and after success.
import { useState } from "preact/hooks";
import { showError } from "../errors";
import { Dialog, type DialogSpec } from "./Dialog";

interface Props {
  testid: string;
  /** The button's text, with the count: "Create plan for 42 items". */
  label: string;
  /** The RPC, for the error box: "CreatePlan". */
  what: string;
  dialog: DialogSpec;
  run: (reason: string) => Promise<void>;
  disabled?: boolean;
  primary?: boolean;
  danger?: boolean;
}

export function ActionButton(p: Props) {
  const [open, setOpen] = useState(false);
  const [busy, setBusy] = useState(false);
  const [done, setDone] = useState(false);
  const confirm = async (reason: string) => {
    setBusy(true);
    try {
      await p.run(reason);
      setDone(true);
    } catch (err) {
      showError(p.what, err);
    } finally {
      setBusy(false);
      setOpen(false);
    }
  };
  const cls = p.danger ? "danger" : p.primary ? "primary" : undefined;
  return (
    <>
      <button
        type="button"
        class={cls}
        data-testid={p.testid}
        disabled={p.disabled || busy || done || open}
        onClick={() => setOpen(true)}
      >
        {p.label}
      </button>
      {open && (
        <Dialog {...p.dialog} danger={p.dialog.danger ?? p.danger} onConfirm={confirm} onCancel={() => setOpen(false)} />
      )}
    </>
  );
}
