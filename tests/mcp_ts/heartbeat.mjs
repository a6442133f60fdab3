// A host that resets its request timeout on every progress notification (opencode does, with the TypeScript SDK's
// resetTimeoutOnProgress) crafting through `flakebot mcp` while one step (a model reply) takes longer than that
// timeout; a second session follows the same run with `status` and wait_seconds, as an agent would, counting turns.
// Usage: node heartbeat.mjs PYTHON CRAFT_ARGUMENTS_JSON TIMEOUT_MS; prints one JSON object of what it saw.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [python, craftArguments, timeoutMs] = process.argv.slice(2);
const connect = async (name) => {
  const transport = new StdioClientTransport({ command: python, args: ["-m", "flakebot", "mcp"], env: process.env, stderr: "ignore" });
  const client = new Client({ name, version: "1.0.0" });
  await client.connect(transport);
  return client;
};
const timeout = Number(timeoutMs);
const holdSeconds = Math.max(1, Math.floor(timeout / 1000) - 10); // a held status call ends well inside the timeout
const seen = { progress: [], statusCalls: [] };
const crafter = await connect("flakebot-tests-ts-heartbeat");
const follower = await connect("flakebot-tests-ts-follower");
let runId = null;
let followed = null;

const follow = async () => {
  // One status call per turn, each held until the run moves on; under the same timeout (no reset: no progress).
  for (let turn = 0; turn < 200; turn += 1) {
    const started = Date.now();
    const answer = await follower.callTool({ name: "status", arguments: { run_id: runId, wait_seconds: holdSeconds } }, undefined, { timeout });
    const status = JSON.parse(answer.content[0].text);
    seen.statusCalls.push({ status: status.status, seconds: (Date.now() - started) / 1000 });
    if (!["created", "running"].includes(status.status)) return status;
  }
  return null;
};

const started = Date.now();
try {
  const result = await crafter.callTool({ name: "craft", arguments: JSON.parse(craftArguments) }, undefined, {
    timeout,
    resetTimeoutOnProgress: true,
    onprogress: (progress) => {
      seen.progress.push({ at: (Date.now() - started) / 1000, ...progress });
      const run = /^run (\S+) started/.exec(progress.message ?? "");
      if (run && followed === null) {
        runId = run[1];
        followed = follow();
      }
    },
  });
  seen.craft = { isError: result.isError ?? false, text: result.content[0].text };
} catch (error) {
  seen.craft = { error: error.message, code: error.code };
}
seen.seconds = (Date.now() - started) / 1000;
seen.followed = followed === null ? null : await followed;
seen.tools = (await crafter.listTools()).tools.map((tool) => ({ name: tool.name, annotations: tool.annotations ?? null }));
await crafter.close();
await follower.close();
console.log(JSON.stringify(seen));
