// A line diff (longest common subsequence) laid out side by side.
export interface DiffRow {
  left: string | null;
  right: string | null;
  kind: "same" | "removed" | "added" | "changed";
}

const MAX_CELLS = 4_000_000;

export function lineDiff(a: string, b: string): DiffRow[] {
  const x = a.split("\n");
  const y = b.split("\n");
  // Common head and tail first: most edits are small.
  let head = 0;
  while (head < x.length && head < y.length && x[head] === y[head]) head++;
  let tail = 0;
  while (tail < x.length - head && tail < y.length - head && x[x.length - 1 - tail] === y[y.length - 1 - tail]) tail++;
  const xs = x.slice(head, x.length - tail);
  const ys = y.slice(head, y.length - tail);
  const rows: DiffRow[] = x.slice(0, head).map((l) => ({ left: l, right: l, kind: "same" }));
  rows.push(...middle(xs, ys));
  rows.push(...x.slice(x.length - tail).map((l): DiffRow => ({ left: l, right: l, kind: "same" })));
  return rows;
}

function middle(xs: string[], ys: string[]): DiffRow[] {
  const n = xs.length;
  const m = ys.length;
  if ((n + 1) * (m + 1) > MAX_CELLS) {
    // Too large to align: everything in the middle differs.
    return pair(xs, ys);
  }
  const w = m + 1;
  const lcs = new Uint32Array((n + 1) * w);
  for (let i = n - 1; i >= 0; i--)
    for (let j = m - 1; j >= 0; j--)
      lcs[i * w + j] = xs[i] === ys[j] ? lcs[(i + 1) * w + j + 1] + 1 : Math.max(lcs[(i + 1) * w + j], lcs[i * w + j + 1]);
  const out: DiffRow[] = [];
  let del: string[] = [];
  let add: string[] = [];
  const flush = () => {
    out.push(...pair(del, add));
    del = [];
    add = [];
  };
  let i = 0;
  let j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && xs[i] === ys[j]) {
      flush();
      out.push({ left: xs[i], right: ys[j], kind: "same" });
      i++;
      j++;
    } else if (j < m && (i === n || lcs[i * w + j + 1] >= lcs[(i + 1) * w + j])) {
      add.push(ys[j++]);
    } else {
      del.push(xs[i++]);
    }
  }
  flush();
  return out;
}

/** Removed and added lines side by side: a changed line where both have one. */
function pair(del: string[], add: string[]): DiffRow[] {
  const out: DiffRow[] = [];
  for (let k = 0; k < Math.max(del.length, add.length); k++) {
    const l = k < del.length ? del[k] : null;
    const r = k < add.length ? add[k] : null;
    out.push({ left: l, right: r, kind: l !== null && r !== null ? "changed" : l !== null ? "removed" : "added" });
  }
  return out;
}
