// Hash routing: `#/plans/42?x=1` → { parts: ["plans", "42"], query }.
import { useEffect, useState } from "preact/hooks";

export interface Route {
  parts: string[];
  query: URLSearchParams;
}

export function parseHash(hash: string): Route {
  const h = hash.replace(/^#/, "");
  const q = h.indexOf("?");
  const path = q < 0 ? h : h.slice(0, q);
  const query = new URLSearchParams(q < 0 ? "" : h.slice(q + 1));
  try {
    const parts = path
      .split("/")
      .filter((p) => p !== "")
      .map((p) => decodeURIComponent(p));
    return { parts, query };
  } catch {
    // A malformed escape (`%E0%A4%A`) names no screen: the "Not found" one.
    return { parts: ["\u0000malformed"], query };
  }
}

export function useRoute(): Route {
  const [hash, setHash] = useState(window.location.hash);
  useEffect(() => {
    const on = () => setHash(window.location.hash);
    window.addEventListener("hashchange", on);
    return () => window.removeEventListener("hashchange", on);
  }, []);
  return parseHash(hash);
}

export function navigate(hash: string): void {
  window.location.hash = hash;
}

/** `#/dead-letters?source=a&reason=b` with empty values left out. */
export function hashWith(path: string, params: Record<string, string | undefined>): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v) q.set(k, v);
  const s = q.toString();
  return s ? `#${path}?${s}` : `#${path}`;
}
