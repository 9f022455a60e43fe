// The console's one connection to the planner: a grpc-web transport to the
// page's own origin (tonic-web, binary protobuf), a client of the Planner
// service, the bearer token kept in sessionStorage, and error formatting.
import { Code, ConnectError, createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import { Planner, type Caller } from "./gen/redrive/v1/planner_pb";

const TOKEN_KEY = "redrive.token";

/**
 * Why `token` cannot be sent as a bearer token, or null: an HTTP header
 * value carries visible ASCII only (RFC 6750's b64token, RFC 7519's JWT).
 */
export function tokenProblem(token: string): string | null {
  return /^[\x21-\x7e]*$/.test(token)
    ? null
    : "a bearer token holds visible ASCII characters only: check what was pasted";
}

/**
 * The stored token: null when nobody signed in (or what is stored could
 * never be sent), "" for a planner without authentication.
 */
export function getToken(): string | null {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token !== null && tokenProblem(token) === null ? token : null;
}

export function setToken(token: string): void {
  sessionStorage.setItem(TOKEN_KEY, token);
}

export function clearToken(): void {
  sessionStorage.removeItem(TOKEN_KEY);
}

// Every call carries `authorization: Bearer <token>` (no cookies are used).
const auth: Interceptor = (next) => (req) => {
  const token = getToken();
  if (token) req.header.set("authorization", `Bearer ${token}`);
  return next(req);
};

const transport = createGrpcWebTransport({
  baseUrl: window.location.origin,
  useBinaryFormat: true,
  interceptors: [auth],
  // The token travels in a header only.
  fetch: (input, init) => globalThis.fetch(input, { ...init, credentials: "omit" }),
});

export const planner = createClient(Planner, transport);

/** "FAILED_PRECONDITION: the precheck is too old" from any thrown value. */
export function formatError(err: unknown): string {
  if (err instanceof ConnectError) {
    const name = Code[err.code] ?? String(err.code);
    const grpcName = name.replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
    return `${grpcName}: ${err.rawMessage}`;
  }
  if (err instanceof Error) return err.message;
  return String(err);
}

export function isUnauthenticated(err: unknown): boolean {
  return err instanceof ConnectError && err.code === Code.Unauthenticated;
}

// Which roles may call which RPC (the server re-checks every call).
const OPERATOR_RPCS = [
  "RunPrecheck",
  "CreatePlan",
  "PausePlan",
  "ResumePlan",
  "CancelPlan",
  "RepairDeadLetter",
  "ArchiveDeadLetters",
] as const;
const APPROVER_RPCS = ["ApprovePlan", "PromotePlan"] as const;
export type Action = (typeof OPERATOR_RPCS)[number] | (typeof APPROVER_RPCS)[number];

export function can(caller: Caller, action: Action): boolean {
  const roles = caller.roles;
  if (roles.includes("admin")) return true;
  if ((OPERATOR_RPCS as readonly string[]).includes(action)) return roles.includes("operator");
  if ((APPROVER_RPCS as readonly string[]).includes(action)) return roles.includes("approver");
  return false;
}
