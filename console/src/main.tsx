// The console: sign-in, the caller, the header and the hash routes.
import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import { actionMethod, actionWords } from "./actions";
import { clearToken, getToken, isUnauthenticated, planner, setToken } from "./api";
import { clearError, showError, useShownError } from "./errors";
import type { Caller } from "./gen/redrive/v1/planner_pb";
import { useRoute, type Route } from "./router";
import { Audit } from "./screens/Audit";
import { DeadLetter } from "./screens/DeadLetter";
import { DeadLetters } from "./screens/DeadLetters";
import { Overview } from "./screens/Overview";
import { Plan } from "./screens/Plan";
import { PlanBuilder } from "./screens/PlanBuilder";
import { Plans } from "./screens/Plans";
import { Precheck } from "./screens/Precheck";
import { Repair } from "./screens/Repair";
import { SignIn } from "./screens/SignIn";

function ErrorBox() {
  const e = useShownError();
  if (!e) return null;
  return (
    <div class="error" role="alert" data-testid="error">
      <strong title={actionMethod(e.what)}>{actionWords(e.what)} failed:</strong> {e.text}
      <button type="button" class="link" aria-label="Dismiss the error" onClick={clearError}>
        ×
      </button>
    </div>
  );
}

function Screen({ route, caller }: { route: Route; caller: Caller }) {
  const [a, b, c] = route.parts;
  switch (a) {
    case undefined:
      return <Overview caller={caller} />;
    case "dead-letters":
      if (b === undefined) return <DeadLetters caller={caller} query={route.query} key={route.query.toString()} />;
      if (c === "repair") return <Repair caller={caller} id={b} />;
      return <DeadLetter caller={caller} id={b} />;
    case "prechecks":
      if (b !== undefined) return <Precheck caller={caller} id={b} />;
      break;
    case "plans":
      if (b === undefined) return <Plans />;
      if (b === "new") return <PlanBuilder caller={caller} precheckId={route.query.get("precheck") ?? ""} />;
      if (c === "audit") return <Audit id={b} />;
      return <Plan caller={caller} id={b} />;
  }
  return (
    <section>
      <h1>Not found</h1>
      <p>
        Nothing at this address. <a href="#/">Back to the overview</a>.
      </p>
    </section>
  );
}

function App() {
  const route = useRoute();
  const [token, setTok] = useState(getToken());
  const [caller, setCaller] = useState<Caller | null>(null);
  const routeKey = route.parts.join("/");

  useEffect(clearError, [routeKey]);

  useEffect(() => {
    if (token === null) return;
    let live = true;
    planner.getCaller({}).then(
      (c) => live && setCaller(c),
      (err) => {
        if (!live) return;
        showError("GetCaller", err);
        if (isUnauthenticated(err)) {
          clearToken();
          setTok(null);
        }
      },
    );
    return () => {
      live = false;
    };
  }, [token]);

  const signIn = (t: string) => {
    clearError();
    setToken(t);
    setTok(t);
  };
  const signOut = () => {
    clearToken();
    setCaller(null);
    setTok(null);
    window.location.hash = "#/";
  };

  if (token === null) {
    return (
      <main class="signin-page">
        <ErrorBox />
        <SignIn onSubmit={signIn} />
      </main>
    );
  }

  const section = route.parts[0] ?? "";
  return (
    <>
      <header class="top">
        <span class="brand">Redrive</span>
        <nav aria-label="Main">
          <a href="#/" data-testid="nav-overview" class={section === "" ? "active" : undefined}>
            Overview
          </a>
          <a href="#/dead-letters" data-testid="nav-dead-letters" class={section === "dead-letters" ? "active" : undefined}>
            Dead letters
          </a>
          <a href="#/plans" data-testid="nav-plans" class={section === "plans" ? "active" : undefined}>
            Plans
          </a>
        </nav>
        <span class="caller" data-testid="caller">
          {caller ? (
            <>
              <strong>{caller.authenticated ? caller.name || "(unnamed)" : "anonymous (no authentication)"}</strong>{" "}
              <span class="muted">{caller.roles.join(", ") || "no roles"}</span>
              {caller.fourEyes && <span class="badge">four-eyes</span>}
            </>
          ) : (
            "…"
          )}
        </span>
        <button type="button" data-testid="signout" onClick={signOut}>
          Sign out
        </button>
      </header>
      <main>
        <ErrorBox />
        {caller ? <Screen route={route} caller={caller} key={routeKey} /> : <p class="muted">Loading…</p>}
      </main>
    </>
  );
}

render(<App />, document.getElementById("app")!);
