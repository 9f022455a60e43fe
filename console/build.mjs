// Bundles the console into dist/ (app.js, app.css, index.html), which the
// planner embeds. Deterministic: the same sources give the same bytes.
import { build } from "esbuild";
import { copyFileSync, mkdirSync, rmSync } from "node:fs";

rmSync("dist", { recursive: true, force: true });
mkdirSync("dist");

const common = {
  bundle: true,
  minify: true,
  sourcemap: false,
  legalComments: "none",
  logLevel: "info",
  charset: "utf8",
};

await build({
  ...common,
  entryPoints: ["src/main.tsx"],
  outfile: "dist/app.js",
  format: "iife",
  target: "es2020",
  platform: "browser",
  jsx: "automatic",
  jsxImportSource: "preact",
  define: { "process.env.NODE_ENV": '"production"' },
});

await build({
  ...common,
  entryPoints: ["src/app.css"],
  outfile: "dist/app.css",
});

copyFileSync("index.html", "dist/index.html");
