import { lineDiff } from "../diff";

/** The diff's rows as table rows; unchanged runs longer than 6 lines fold. */
export function diffRows(a: string, b: string) {
  const rows = lineDiff(a, b);
  const out = [];
  for (let i = 0; i < rows.length; i++) {
    const r = rows[i];
    if (r.kind === "same") {
      let j = i;
      while (j < rows.length && rows[j].kind === "same") j++;
      const run = j - i;
      if (run > 6) {
        const keepHead = i === 0 ? 0 : 2;
        const keepTail = j === rows.length ? 0 : 2;
        for (let k = i; k < i + keepHead; k++) out.push(row(rows[k], k));
        out.push(
          <tr key={`fold-${i}`} class="fold">
            <td colSpan={2}>… {run - keepHead - keepTail} unchanged lines …</td>
          </tr>,
        );
        for (let k = j - keepTail; k < j; k++) out.push(row(rows[k], k));
        i = j - 1;
        continue;
      }
    }
    out.push(row(r, i));
  }
  return out;
}

function row(r: ReturnType<typeof lineDiff>[number], k: number) {
  return (
    <tr key={k} class={`d-${r.kind}`} data-kind={r.kind}>
      <td class={r.left === null ? "empty" : undefined}>{r.left ?? ""}</td>
      <td class={r.right === null ? "empty" : undefined}>{r.right ?? ""}</td>
    </tr>
  );
}
