// A precheck's verdicts as one horizontal bar: a segment per verdict, sized
// by its count and labeled with it; a click selects that verdict.
import { Verdict, type VerdictCounts } from "../gen/redrive/v1/messages_pb";

/** VerdictCounts' fields in order, with their proto names and verdicts. */
export const VERDICTS: { name: string; field: keyof VerdictCountsFields; verdict: Verdict }[] = [
  { name: "replayable", field: "replayable", verdict: Verdict.REPLAYABLE },
  { name: "duplicate", field: "duplicate", verdict: Verdict.DUPLICATE },
  { name: "already_replayed", field: "alreadyReplayed", verdict: Verdict.ALREADY_REPLAYED },
  { name: "looping", field: "looping", verdict: Verdict.LOOPING },
  { name: "stale", field: "stale", verdict: Verdict.STALE },
  { name: "blocked_by_state", field: "blockedByState", verdict: Verdict.BLOCKED_BY_STATE },
  { name: "needs_compensation", field: "needsCompensation", verdict: Verdict.NEEDS_COMPENSATION },
  { name: "invalid", field: "invalid", verdict: Verdict.INVALID },
];

type VerdictCountsFields = Omit<VerdictCounts, "$typeName" | "$unknown">;

interface Props {
  counts: VerdictCounts | undefined;
  selected?: string;
  onSelect: (name: string) => void;
}

export function VerdictBar({ counts, selected, onSelect }: Props) {
  const segs = VERDICTS.map((v) => ({ ...v, count: counts ? counts[v.field] : 0n })).filter((s) => s.count > 0n);
  return (
    <div class="verdict-bar" data-testid="verdict-bar" role="group" aria-label="Verdicts">
      {segs.length === 0 && <span class="muted">no items</span>}
      {segs.map((s) => (
        <button
          type="button"
          key={s.name}
          class={`verdict-segment v-${s.name}${selected === s.name ? " selected" : ""}`}
          data-testid="verdict-segment"
          data-verdict={s.name}
          data-count={s.count.toString()}
          style={{ flexGrow: Number(s.count) }}
          title={`${s.name}: ${s.count}`}
          aria-pressed={selected === s.name}
          onClick={() => onSelect(s.name)}
        >
          <span class="seg-name">{s.name.replace(/_/g, " ")}</span> <span class="seg-count">{s.count.toString()}</span>
        </button>
      ))}
    </div>
  );
}
