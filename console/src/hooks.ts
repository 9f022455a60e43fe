import { useCallback, useEffect, useRef, useState } from "preact/hooks";
import { showError } from "./errors";

export interface Loaded<T> {
  data: T | undefined;
  loading: boolean;
  reload: () => void;
}

/**
 * Calls `fn` when `deps` change (and on reload()); a failure shows in the
 * error box as "<what> failed: ...". An answer that arrives after the deps
 * changed again is dropped.
 */
export function useLoad<T>(what: string, fn: () => Promise<T>, deps: unknown[]): Loaded<T> {
  const [data, setData] = useState<T | undefined>(undefined);
  const [loading, setLoading] = useState(true);
  const [tick, setTick] = useState(0);
  const seq = useRef(0);
  useEffect(() => {
    const mine = ++seq.current;
    setLoading(true);
    fn().then(
      (d) => {
        if (seq.current !== mine) return;
        setData(d);
        setLoading(false);
      },
      (err) => {
        if (seq.current !== mine) return;
        setLoading(false);
        showError(what, err);
      },
    );
  }, [...deps, tick]);
  const reload = useCallback(() => setTick((t) => t + 1), []);
  return { data, loading, reload };
}

/** The current time in milliseconds, refreshed every `everyMs`. */
export function useNow(everyMs = 1000): number {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    const t = setInterval(() => setNow(Date.now()), everyMs);
    return () => clearInterval(t);
  }, [everyMs]);
  return now;
}
