// Drives `flakebot mcp` with the official MCP TypeScript SDK's task API (client.experimental.tasks), as a host that
// runs long tools as MCP tasks would: a package run as a task and followed to its result by the SDK's own polling,
// tasks/list, a craft cancelled while it runs, and what a task that is gone or already done answers.
// Usage: node tasks.mjs PYTHON PACKAGE_ARGUMENTS_JSON CRAFT_ARGUMENTS_JSON; prints one JSON object of what it saw.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { CallToolResultSchema, CreateTaskResultSchema } from "@modelcontextprotocol/sdk/types.js";

const [python, packageArguments, craftArguments] = process.argv.slice(2);
const transport = new StdioClientTransport({ command: python, args: ["-m", "flakebot", "mcp"], env: process.env, stderr: "ignore" });
const client = new Client({ name: "flakebot-tests-ts-tasks", version: "1.0.0" });
await client.connect(transport);
const tasks = client.experimental.tasks;
const refusal = async (promise) => {
  try {
    return { answered: await promise };
  } catch (error) {
    return { code: error.code, message: error.message };
  }
};
const seen = { capabilities: client.getServerCapabilities() };
seen.execution = Object.fromEntries((await client.listTools()).tools.map((tool) => [tool.name, tool.execution ?? null]));

const long = { timeout: 600000 };
seen.package = [];
const stream = tasks.callToolStream({ name: "package", arguments: JSON.parse(packageArguments) }, CallToolResultSchema, long);
for await (const message of stream) {
  seen.package.push(message.type === "error" ? { type: "error", error: message.error.message } : message);
}
seen.listed = await tasks.listTasks();

// A call the job refuses (a library crate, no binary to package: found out only once the job reads the crate; a
// crate the registry lacks is refused before a job now) fails; one whose ttl has passed once it failed is forgotten.
const refused = {
  method: "tools/call",
  params: { name: "package", arguments: { target: "csv", registry: "local" } },
};
const failedId = (await client.request(refused, CreateTaskResultSchema, { task: {} })).task.taskId;
const briefId = (await client.request(refused, CreateTaskResultSchema, { task: { ttl: 1 } })).task.taskId;
for (let i = 0; i < 240 && (await tasks.getTask(failedId)).status === "working"; i += 1) {
  await new Promise((resolve) => setTimeout(resolve, 250));
}
seen.failed = await tasks.getTask(failedId);
seen.failedResult = await tasks.getTaskResult(failedId, CallToolResultSchema);
seen.brief = await refusal(tasks.getTaskResult(briefId, CallToolResultSchema));

// A craft whose model takes minutes to answer: cancelled once its run is in the spec stage.
const call = { method: "tools/call", params: { name: "craft", arguments: JSON.parse(craftArguments) } };
seen.craft = await client.request(call, CreateTaskResultSchema, { task: { ttl: 600000 } });
const craftId = seen.craft.task.taskId;
seen.polls = [];
for (let i = 0; i < 240; i += 1) {
  const task = await tasks.getTask(craftId);
  seen.polls.push(task.statusMessage);
  if (task.status !== "working" || task.statusMessage?.startsWith("spec: ")) break;
  await new Promise((resolve) => setTimeout(resolve, 250));
}
seen.cancelled = await tasks.cancelTask(craftId);
seen.afterCancel = await tasks.getTask(craftId);
seen.cancelledResult = await tasks.getTaskResult(craftId, CallToolResultSchema);
seen.cancelAgain = await refusal(tasks.cancelTask(craftId));
seen.unknown = await refusal(tasks.getTask("20200101-000000-1-0123456789abcdef"));
seen.notATask = await refusal(client.request({ method: "tools/call", params: { name: "list", arguments: {} } }, CreateTaskResultSchema, { task: {} }));
await client.close();
process.stdout.write(JSON.stringify(seen) + "\n");
