// The headers a replay changes: removed (− name), added or replaced
// (+ name: value), and kept as they are.
interface Props {
  removed: string[];
  added: { name: string; value: string }[];
  kept: string[];
}

export function HeaderDiff({ removed, added, kept }: Props) {
  return (
    <div class="header-diff">
      <div>
        <h4>Removed</h4>
        <ul class="diff-list removed" data-testid="preview-removed">
          {removed.map((n) => (
            <li key={n}>− {n}</li>
          ))}
        </ul>
        {removed.length === 0 && <p class="muted">none</p>}
      </div>
      <div>
        <h4>Added</h4>
        <ul class="diff-list added" data-testid="preview-added">
          {added.map((h) => (
            <li key={h.name}>
              + {h.name}: {h.value}
            </li>
          ))}
        </ul>
        {added.length === 0 && <p class="muted">none</p>}
      </div>
      <div>
        <h4>Kept</h4>
        <ul class="diff-list kept" data-testid="preview-kept">
          {kept.map((n) => (
            <li key={n}>{n}</li>
          ))}
        </ul>
        {kept.length === 0 && <p class="muted">none</p>}
      </div>
    </div>
  );
}
