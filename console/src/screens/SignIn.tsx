// Sign-in: a bearer token (a JWT or a static token), kept in sessionStorage.
import { useState } from "preact/hooks";
import { tokenProblem } from "../api";

export function SignIn({ onSubmit }: { onSubmit: (token: string) => void }) {
  const [token, setToken] = useState("");
  const problem = tokenProblem(token.trim());
  return (
    <form
      class="signin"
      onSubmit={(e) => {
        e.preventDefault();
        if (problem === null) onSubmit(token.trim());
      }}
    >
      <h1>Redrive console</h1>
      <label class="field">
        <span>Bearer token (a JWT or a static token; leave empty when the planner runs without authentication)</span>
        <input
          type="password"
          data-testid="signin-token"
          autoComplete="off"
          spellcheck={false}
          value={token}
          onInput={(e) => setToken(e.currentTarget.value)}
        />
      </label>
      {problem && (
        <p class="invalid" data-testid="signin-problem" role="alert">
          {problem}
        </p>
      )}
      <button type="submit" class="primary" data-testid="signin-submit" disabled={problem !== null}>
        Sign in
      </button>
      <p class="muted">The token stays in this tab (sessionStorage) and is sent as an authorization header.</p>
    </form>
  );
}
