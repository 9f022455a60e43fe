// Runs the unit tests (test/*.test.ts) with node's test runner: esbuild
// bundles each into a temporary folder first (Node 20 runs no TypeScript).
import { build } from "esbuild";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const out = mkdtempSync(join(tmpdir(), "console-test-"));
const tests = readdirSync("test").filter((f) => f.endsWith(".test.ts"));
try {
  await build({
    entryPoints: tests.map((f) => join("test", f)),
    outdir: out,
    bundle: true,
    platform: "node",
    format: "esm",
    outExtension: { ".js": ".mjs" },
    jsx: "automatic",
    jsxImportSource: "preact",
    logLevel: "warning",
  });
  const files = readdirSync(out).map((f) => join(out, f));
  const r = spawnSync(process.execPath, ["--test", ...files], { stdio: "inherit" });
  process.exitCode = r.status ?? 1;
} finally {
  rmSync(out, { recursive: true, force: true });
}
