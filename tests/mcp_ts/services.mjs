// Drives `flakebot mcp`'s service tools with the official MCP TypeScript SDK, as an agent with no network of its
// own would: start a service as an MCP task (followed to its result by the SDK's own polling), store and read a
// value through the request tool, try to reach another port through it, read the log, stop the service.
// Usage: node services.mjs PYTHON SERVICE OTHER_PORT; prints one JSON object of what it saw.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { CallToolResultSchema } from "@modelcontextprotocol/sdk/types.js";

const [python, service, otherPort] = process.argv.slice(2);
const transport = new StdioClientTransport({ command: python, args: ["-m", "flakebot", "mcp"], env: process.env, stderr: "ignore" });
const client = new Client({ name: "flakebot-tests-ts-services", version: "1.0.0" });
await client.connect(transport);
const parsed = (result) => ({ result: JSON.parse(result.content[0].text), isError: Boolean(result.isError) });
const call = async (name, args) => parsed(await client.callTool({ name, arguments: args }, undefined, { timeout: 120000 }));
const seen = {};
const tools = (await client.listTools()).tools;
seen.tools = Object.fromEntries(tools.filter((t) => t.name.startsWith("service")).map((t) => [t.name, { annotations: t.annotations, execution: t.execution ?? null }]));

seen.up = [];
const stream = client.experimental.tasks.callToolStream({ name: "service_up", arguments: { service } }, CallToolResultSchema, { timeout: 120000 });
for await (const message of stream) {
  seen.up.push(message.type === "error" ? { type: "error", error: message.error.message } : message);
}
seen.put = await call("service_request", { service, method: "PUT", path: "/kv/from-ts", body: "typescript" });
seen.get = await call("service_request", { service, method: "GET", path: "/kv/from-ts" });
seen.elsewhere = await call("service_request", { service, method: "GET", path: `@127.0.0.1:${otherPort}/` });
seen.logs = await call("service_logs", { service, lines: 20 });
seen.listed = await call("services", {});
seen.down = await call("service_down", { service });
seen.afterDown = await call("service_request", { service, method: "GET", path: "/health" });
await client.close();
process.stdout.write(JSON.stringify(seen) + "\n");
