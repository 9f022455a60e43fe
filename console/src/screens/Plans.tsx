// Plans (#/plans): every plan, newest first as the planner lists them.
import { useState } from "preact/hooks";
import { planner } from "../api";
import { PlanKind } from "../gen/redrive/v1/messages_pb";
import { fmtTime, num, stateName } from "../format";
import { useLoad } from "../hooks";
import { navigate } from "../router";

export function Plans() {
  const [tokens, setTokens] = useState<string[]>([""]);
  const token = tokens[tokens.length - 1];
  const page = useLoad("ListPlans", () => planner.listPlans({ pageSize: 50, pageToken: token }), [token]);
  return (
    <section>
      <h1>Plans</h1>
      <table class="table">
        <thead>
          <tr>
            <th scope="col">Plan</th>
            <th scope="col">Kind</th>
            <th scope="col">State</th>
            <th scope="col" class="num">Items</th>
            <th scope="col" class="num">Done</th>
            <th scope="col">Created by</th>
            <th scope="col">Created at</th>
          </tr>
        </thead>
        <tbody>
          {page.data?.plans.map((p) => {
            const href = `#/plans/${encodeURIComponent(p.planId)}`;
            return (
              <tr
                key={p.planId}
                class="clickable"
                data-testid="plan-row"
                data-id={p.planId}
                tabIndex={0}
                onClick={() => navigate(href)}
                onKeyDown={(e) => e.key === "Enter" && navigate(href)}
              >
                <td class="mono">
                  <a href={href} onClick={(e) => e.stopPropagation()}>
                    {p.planId}
                  </a>
                </td>
                <td>{p.kind === PlanKind.SINGLE ? "single" : "bulk"}</td>
                <td>
                  <span class={`state s-${stateName(p.state).replace(/ /g, "-")}`}>{stateName(p.state)}</span>
                </td>
                <td class="num">{num(p.totalItems)}</td>
                <td class="num">{num(p.itemsDone)}</td>
                <td>{p.createdBy || "—"}</td>
                <td class="nowrap">{fmtTime(p.createdAt)}</td>
              </tr>
            );
          })}
        </tbody>
      </table>
      {page.data && page.data.plans.length === 0 && <p class="muted">No plans yet.</p>}
      <div class="pager">
        <button type="button" data-testid="plans-prev-page" disabled={tokens.length <= 1} onClick={() => setTokens(tokens.slice(0, -1))}>
          ← Previous page
        </button>
        <span class="muted">page {tokens.length}</span>
        <button
          type="button"
          data-testid="plans-next-page"
          disabled={!page.data?.nextPageToken}
          onClick={() => page.data && setTokens([...tokens, page.data.nextPageToken])}
        >
          Next page →
        </button>
      </div>
    </section>
  );
}
