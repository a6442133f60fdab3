// Drives `flakebot mcp` with the official MCP TypeScript SDK's client over stdio, as an agent host would:
// list the tools, craft one (with progress), call the crafted tool by its own name, remove it.
// Usage: node client.mjs PYTHON CRAFT_ARGUMENTS_JSON; prints one JSON object of what it saw.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { ToolListChangedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

const [python, craftArguments] = process.argv.slice(2);
const transport = new StdioClientTransport({ command: python, args: ["-m", "flakebot", "mcp"], env: process.env, stderr: "ignore" });
const client = new Client({ name: "flakebot-tests-ts", version: "1.0.0" });
let changes = 0;
client.setNotificationHandler(ToolListChangedNotificationSchema, () => { changes += 1; });
await client.connect(transport);

const names = async () => (await client.listTools()).tools.map((tool) => tool.name);
const parsed = (result) => ({ result: JSON.parse(result.content[0].text), isError: Boolean(result.isError) });
const seen = { server: client.getServerVersion(), capabilities: client.getServerCapabilities(), before: await names(), progress: [] };

const options = { onprogress: (p) => seen.progress.push(p), timeout: 60000, resetTimeoutOnProgress: true, maxTotalTimeout: 1800000 };
seen.craft = parsed(await client.callTool({ name: "craft", arguments: JSON.parse(craftArguments) }, undefined, options));
seen.changesAfterCraft = changes;
const tools = (await client.listTools()).tools;
seen.tool = tools.find((tool) => tool.name === seen.craft.result.name) ?? null;
seen.call = parsed(await client.callTool({ name: seen.craft.result.name, arguments: { stdin: "hello from typescript\n" } }));
seen.badCall = parsed(await client.callTool({ name: seen.craft.result.name, arguments: { colour: "red" } }));
seen.rm = parsed(await client.callTool({ name: "rm", arguments: { tool: seen.craft.result.name } }));
await new Promise((resolve) => setTimeout(resolve, 300)); // the notification may trail the result
seen.changesAfterRm = changes;
seen.after = await names();
await client.close();
process.stdout.write(JSON.stringify(seen) + "\n");
