// Messages sent per second over the last 60 seconds (from WatchPlan's SENT
// audit events, bucketed by their time), with the plan's rate as a line.
interface Props {
  /** Epoch second → SENT events in that second. */
  perSecond: Map<number, number>;
  /** The current epoch second. */
  nowSecond: number;
  rate: number;
  sentTotal: number;
}

const W = 600;
const H = 160;
const PAD = 28;
const SECONDS = 60;

export function RateChart({ perSecond, nowSecond, rate, sentTotal }: Props) {
  const counts: number[] = [];
  for (let s = nowSecond - SECONDS + 1; s <= nowSecond; s++) counts.push(perSecond.get(s) ?? 0);
  const top = Math.max(1, rate, ...counts) * 1.15;
  const y = (v: number) => H - PAD - (v / top) * (H - 2 * PAD);
  const barW = (W - PAD) / SECONDS;
  const rateY = y(rate);
  const label = `Sent per second over the last ${SECONDS} s; ${sentTotal} sent events seen; rate limit ${rate}/s`;
  return (
    <svg
      class="rate-chart"
      data-testid="rate-chart"
      data-sent-total={sentTotal}
      width={W}
      height={H}
      viewBox={`0 0 ${W} ${H}`}
      role="img"
      aria-label={label}
    >
      <title>{label}</title>
      <line x1={PAD} y1={H - PAD} x2={W} y2={H - PAD} class="axis" />
      {counts.map((c, i) =>
        c > 0 ? (
          <rect
            key={i}
            class="bar"
            x={PAD + i * barW + 1}
            y={y(c)}
            width={Math.max(1, barW - 2)}
            height={H - PAD - y(c)}
          />
        ) : null,
      )}
      <line x1={PAD} y1={rateY} x2={W} y2={rateY} class="rate-line" data-testid="rate-line" />
      <text x={PAD + 4} y={rateY - 4} class="chart-label">
        rate {rate}/s
      </text>
      <text x={2} y={H - 8} class="chart-label">
        −60 s
      </text>
      <text x={W - 30} y={H - 8} class="chart-label">
        now
      </text>
    </svg>
  );
}
