// Copies the dashboard's and the API reference's browser dependencies from node_modules (installed from
// package-lock.json with `npm ci`) into assets/vendor/, which is committed and embedded in the
// binary. The output depends only on the locked packages, so CI can rebuild it and fail on a
// diff. Source-map references are dropped: the maps are not shipped.
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "assets", "vendor");

const files = [
  ["@xterm/xterm/lib/xterm.js", "xterm.js"],
  ["@xterm/xterm/css/xterm.css", "xterm.css"],
  ["@xterm/xterm/LICENSE", "xterm.LICENSE"],
  ["@xterm/addon-fit/lib/addon-fit.js", "addon-fit.js"],
  ["@xterm/addon-fit/LICENSE", "addon-fit.LICENSE"],
  // The API reference at /docs: Redoc's standalone build (React and its other dependencies
  // bundled in), its licence, and the notices of what it bundles.
  ["redoc/bundles/redoc.standalone.js", "redoc.standalone.js"],
  ["redoc/bundles/redoc.standalone.js.LICENSE.txt", "redoc.standalone.NOTICES"],
  ["redoc/LICENSE", "redoc.LICENSE"],
];

rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
for (const [from, to] of files) {
  let text = readFileSync(join(here, "node_modules", from), "utf8");
  text = text.replace(/\n?\/\/# sourceMappingURL=\S+\s*$/, "\n");
  if (!text.endsWith("\n")) text += "\n";
  writeFileSync(join(out, to), text);
}
