// Removes every sandbox, template and volume of the server at BOTHY_URL (force-stopping running
// sandboxes first). test-live.sh runs it before it stops the server, so that a failed test
// leaves nothing running behind it. It uses the built SDK.
import { Bothy } from "../dist/src/index.js";

const client = new Bothy({ baseUrl: process.env.BOTHY_URL, token: process.env.BOTHY_TOKEN || undefined });
const sandboxes = [];
for (let cursor; ; ) {
  const page = await client.listSandboxes({ cursor, limit: 1000 });
  sandboxes.push(...page.items);
  cursor = page.next_cursor;
  if (cursor === undefined) break;
}
for (const s of sandboxes) {
  try {
    if (s.state !== "provisioned" && s.state !== "stopped") await client.stopSandbox(s.id, { force: true });
    await client.deleteSandbox(s.id);
    console.error(`remove-all: removed sandbox ${s.id}, which a test left behind`);
  } catch (err) {
    console.error(`remove-all: sandbox ${s.id}: ${err.message}`);
  }
}
for (const t of (await client.listTemplates({ limit: 1000 })).items) {
  try {
    await client.deleteTemplate(t.name, { drain: true });
  } catch (err) {
    console.error(`remove-all: template ${t.name}: ${err.message}`);
  }
}
for (const v of await client.listVolumes()) {
  try {
    await client.deleteVolume(v.name);
  } catch (err) {
    console.error(`remove-all: volume ${v.name}: ${err.message}`);
  }
}
