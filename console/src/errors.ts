// The page's one error box (data-testid="error"): what failed and the gRPC
// status. Screens report here; a route change clears it.
import { useEffect, useState } from "preact/hooks";
import { formatError } from "./api";

export interface ShownError {
  what: string;
  text: string;
}

let current: ShownError | null = null;
const listeners = new Set<(e: ShownError | null) => void>();

function publish(): void {
  for (const l of listeners) l(current);
}

/** Shows "<what> failed: CODE: message". */
export function showError(what: string, err: unknown): void {
  current = { what, text: formatError(err) };
  publish();
}

export function clearError(): void {
  if (current === null) return;
  current = null;
  publish();
}

/** Clears the error box if it shows a failure of `what` (it recovered). */
export function clearErrorOf(what: string): void {
  if (current?.what === what) clearError();
}

export function useShownError(): ShownError | null {
  const [e, setE] = useState(current);
  useEffect(() => {
    listeners.add(setE);
    return () => {
      listeners.delete(setE);
    };
  }, []);
  return e;
}
