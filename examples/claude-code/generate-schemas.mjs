// Writes schemas/HookInput.json and schemas/SyncHookJSONOutput.json from the SDK's declarations.
// `node generate-schemas.mjs --check` writes nothing and exits 1 when the committed files differ
// (tests/test_claude_code_schemas.py runs it).
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { createGenerator } from "ts-json-schema-generator";

const here = dirname(fileURLToPath(import.meta.url));
const sdk = JSON.parse(
  readFileSync(join(here, "node_modules/@anthropic-ai/claude-agent-sdk/package.json"), "utf8"),
);
const generator = createGenerator({
  path: join(here, "hook-types.ts"),
  tsconfig: join(here, "tsconfig.json"),
  type: "*",
  skipTypeCheck: true,
});
const check = process.argv.includes("--check");
let stale = 0;
for (const type of ["HookInput", "SyncHookJSONOutput"]) {
  const schema = {
    $comment: `made by examples/claude-code/generate-schemas.mjs from ${sdk.name} ${sdk.version} (sdk.d.ts); do not edit`,
    ...generator.createSchema(type),
  };
  const path = join(here, "schemas", `${type}.json`);
  const text = JSON.stringify(schema, null, 2) + "\n";
  if (!check) {
    writeFileSync(path, text);
    console.log(`wrote ${path}`);
    continue;
  }
  let committed = "";
  try {
    committed = readFileSync(path, "utf8");
  } catch {}
  if (committed !== text) {
    console.log(`${path} differs from what ${sdk.name} ${sdk.version} declares`);
    stale += 1;
  }
}
process.exit(stale ? 1 : 0);
