// A host that runs a craft as an MCP task (the TypeScript SDK's task requests) and shows its user every statusMessage
// tasks/get answers until the task ends. Usage: node task_status.mjs PYTHON CRAFT_ARGUMENTS_JSON; prints one JSON
// object: the messages seen, the final task, and its result.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { CallToolResultSchema, CreateTaskResultSchema } from "@modelcontextprotocol/sdk/types.js";

const [python, craftArguments] = process.argv.slice(2);
const transport = new StdioClientTransport({ command: python, args: ["-m", "flakebot", "mcp"], env: process.env, stderr: "ignore" });
const client = new Client({ name: "flakebot-tests-ts-task-status", version: "1.0.0" });
await client.connect(transport);
const tasks = client.experimental.tasks;
const call = { method: "tools/call", params: { name: "craft", arguments: JSON.parse(craftArguments) } };
const taskId = (await client.request(call, CreateTaskResultSchema, { task: {} })).task.taskId;
const seen = { messages: [] };
for (let i = 0; i < 1200; i += 1) {
  const task = await tasks.getTask(taskId);
  if (seen.messages.at(-1) !== task.statusMessage) seen.messages.push(task.statusMessage);
  seen.task = task;
  if (task.status !== "working") break;
  await new Promise((resolve) => setTimeout(resolve, 20));
}
seen.result = await tasks.getTaskResult(taskId, CallToolResultSchema);
await client.close();
console.log(JSON.stringify(seen));
