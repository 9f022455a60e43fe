// Arrivals per minute over the last hour, oldest first, as a small line.
interface Props {
  values: number[];
  testid?: string;
  width?: number;
  height?: number;
}

export function Sparkline({ values, testid, width = 120, height = 24 }: Props) {
  const max = Math.max(1, ...values);
  const total = values.reduce((a, b) => a + b, 0);
  const step = values.length > 1 ? width / (values.length - 1) : width;
  const points = values
    .map((v, i) => `${(i * step).toFixed(1)},${(height - 1 - (v / max) * (height - 2)).toFixed(1)}`)
    .join(" ");
  const label = `${total} arrivals in the last ${values.length} minutes, at most ${max} a minute`;
  return (
    <svg
      class="sparkline"
      data-testid={testid}
      data-total={total}
      width={width}
      height={height}
      viewBox={`0 0 ${width} ${height}`}
      role="img"
      aria-label={label}
    >
      <title>{label}</title>
      <line x1={0} y1={height - 0.5} x2={width} y2={height - 0.5} class="sparkline-base" />
      {values.length > 0 && <polyline points={points} class="sparkline-line" />}
    </svg>
  );
}
