// Sign-in: a bearer token (a JWT or a static token), kept in sessionStorage.
import { useState } from "preact/hooks";

export function SignIn({ onSubmit }: { onSubmit: (token: string) => void }) {
  const [token, setToken] = useState("");
  return (
    <form
      class="signin"
      onSubmit={(e) => {
        e.preventDefault();
        onSubmit(token.trim());
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
      <button type="submit" class="primary" data-testid="signin-submit">
        Sign in
      </button>
      <p class="muted">The token stays in this tab (sessionStorage) and is sent as an authorization header.</p>
    </form>
  );
}
