// Drives idemops's MCP tasks with the TypeScript SDK's own client (@modelcontextprotocol/sdk 1.x,
// protocol 2025-11-25, "experimental tasks"), as an agent built on it would, and prints what it saw
// as one JSON object. tests/test_mcp_tasks_2025.py runs it and checks the output.
//
//   node tasks_client.mjs <mcp-url> <token> <scenario> <json-arguments>
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import {
  CallToolResultSchema, CreateTaskResultSchema, TaskStatusNotificationSchema,
} from '@modelcontextprotocol/sdk/types.js';

const [url, token, scenario, rawArguments] = process.argv.slice(2);
const args = JSON.parse(rawArguments ?? '{}');
const TERMINAL = ['completed', 'failed', 'cancelled'];

const client = new Client({ name: 'idemops-interop', version: '1.0.0' }, { capabilities: {} });
const statusPushes = [];
const errors = [];
client.setNotificationHandler(TaskStatusNotificationSchema, n => statusPushes.push(n.params.status));
client.onerror = e => errors.push(String(e));
const transport = new StreamableHTTPClientTransport(new URL(url),
  { requestInit: { headers: { Authorization: `Bearer ${token}` } } });
await client.connect(transport);

const out = { protocol: transport.protocolVersion, tasksCapability: client.getServerCapabilities().tasks ?? null };
const { tools } = await client.listTools();  // the client remembers which tools take `task`
out.taskSupport = Object.fromEntries(tools.filter(t => t.execution).map(t => [t.name, t.execution.taskSupport]));

async function startTask(name, toolArguments, task = {}) {
  const created = await client.request(
    { method: 'tools/call', params: { name, arguments: toolArguments, task } }, CreateTaskResultSchema);
  return created.task;
}

async function pollUntilDone(task) {
  const seen = [task.status];
  while (!TERMINAL.includes(task.status)) {
    await new Promise(resolve => setTimeout(resolve, Math.min(task.pollInterval ?? 500, 200)));
    task = await client.experimental.tasks.getTask(task.taskId);
    seen.push(task.status);
  }
  return { task, seen };
}

async function failure(promise) {
  try { await promise; return null; } catch (e) { return { code: e.code, message: e.message }; }
}

switch (scenario) {
  case 'stream': {  // the SDK's all-in-one path: tools/call{task} -> tasks/get polling -> tasks/result
    out.isToolTask = client.isToolTask(args.tool);
    out.messages = [];
    for await (const m of client.experimental.tasks.callToolStream({ name: args.tool, arguments: args.arguments })) {
      out.messages.push(m.type === 'result' ? { result: m.result.structuredContent, isError: m.result.isError }
        : m.type === 'error' ? { error: m.error.message } : { [m.type]: m.task.status, taskId: m.task.taskId });
    }
    break;
  }
  case 'poll': {  // create, poll tasks/get to the end, then read tasks/result
    const created = await startTask(args.tool, args.arguments, { ttl: 60000 });
    const { task, seen } = await pollUntilDone(created);
    const result = await client.experimental.tasks.getTaskResult(task.taskId, CallToolResultSchema);
    out.created = created;
    out.seen = seen;
    out.final = task;
    out.result = { structuredContent: result.structuredContent, isError: result.isError ?? false, meta: result._meta };
    out.list = (await client.experimental.tasks.listTasks()).tasks.map(t => ({ taskId: t.taskId, status: t.status }));
    break;
  }
  case 'wait': {  // tasks/result at once: it blocks; status and progress arrive on its stream meanwhile
    const created = await startTask(args.tool, args.arguments);
    const progress = [];
    const result = await client.experimental.tasks.getTaskResult(created.taskId, CallToolResultSchema,
      { onprogress: p => progress.push([p.progress, p.total, p.message]), timeout: 120000 });
    out.taskId = created.taskId;
    out.result = { structuredContent: result.structuredContent, isError: result.isError ?? false, meta: result._meta };
    out.statusPushes = statusPushes;
    out.progress = progress;
    break;
  }
  case 'cancel': {
    const created = await startTask(args.tool, args.arguments);
    out.taskId = created.taskId;
    out.cancelled = await client.experimental.tasks.cancelTask(created.taskId);
    out.after = await client.experimental.tasks.getTask(created.taskId);
    out.cancelAgain = await failure(client.experimental.tasks.cancelTask(created.taskId));
    const result = await client.experimental.tasks.getTaskResult(created.taskId, CallToolResultSchema);
    out.result = { structuredContent: result.structuredContent, isError: result.isError ?? false };
    break;
  }
  case 'refusals': {
    out.unknownTask = await failure(client.experimental.tasks.getTask('00000000-0000-4000-8000-000000000000'));
    out.notATaskTool = await failure(startTask('whoami', {}));
    out.foreignTask = await failure(client.experimental.tasks.getTask(args.foreignTaskId));
    out.badCursor = await failure(client.experimental.tasks.listTasks('not-a-cursor'));
    break;
  }
  default:
    throw new Error(`unknown scenario ${scenario}`);
}

out.clientErrors = errors;
console.log(JSON.stringify(out));
await client.close();
