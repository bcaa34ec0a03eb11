// Drives idemops's tasks at protocol 2026-07-28 (the io.modelcontextprotocol/tasks extension) with the
// TypeScript SDK's own tasks client, @modelcontextprotocol/ext-tasks (over @modelcontextprotocol/client 2.x),
// as an agent built on it would, and prints what it saw as one JSON object.
// tests/conformance/test_tasks_typescript_2026.py runs it and checks the output.
// (tasks_client.mjs is its 2025-11-25 counterpart, on the 1.x SDK's `experimental.tasks`.)
//
//   node tasks_client_2026.mjs <mcp-url> <token> <scenario> <json-arguments>
//
// The SDK's Client negotiates 2026-07-28 (server/discover) and serves tools/list; ext-tasks sends tools/call
// and tasks/* itself, through `rawDispatch`, because the Client's codecs reject the 2026 task wire shapes
// (the package's README says so): rawDispatch POSTs one JSON-RPC request, with the headers 2026-07-28
// asks for, and answers its JSON-RPC answer.
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { createTaskSessionFromClient, toolDeclarationFromMcpTool } from '@modelcontextprotocol/ext-tasks/client';

const [url, token, scenario, rawArguments] = process.argv.slice(2);
const args = JSON.parse(rawArguments ?? '{}');
const PROTOCOL = '2026-07-28';
const clientInfo = { name: 'idemops-interop-2026', version: '1.0.0' };
const clientCapabilities = { extensions: { 'io.modelcontextprotocol/tasks': {} } };
let ids = 0;

async function rawDispatch(request, options = {}) {
  const message = { jsonrpc: '2.0', id: `raw-${++ids}`, ...request };
  const headers = {
    'Content-Type': 'application/json', Accept: 'application/json, text/event-stream',
    Authorization: `Bearer ${token}`, 'MCP-Protocol-Version': PROTOCOL, 'Mcp-Method': request.method,
    ...(request.method === 'tools/call' ? { 'Mcp-Name': request.params.name } : {}),
    ...(options.context?.headers ?? {}),
  };
  const response = await fetch(url, { method: 'POST', headers, body: JSON.stringify(message), signal: options.signal });
  const body = await response.text();
  let answer;
  if ((response.headers.get('content-type') ?? '').startsWith('text/event-stream')) {
    // the answer is the stream's last `data:` event (notifications may come before it)
    const events = body.split('\n').filter(line => line.startsWith('data:')).map(line => line.slice(5).trim())
      .filter(Boolean).map(data => JSON.parse(data));
    answer = events.filter(event => event.id === message.id).pop();
  } else {
    answer = JSON.parse(body);
  }
  if (!answer) throw new Error(`no JSON-RPC answer to ${request.method}: HTTP ${response.status} ${body.slice(0, 300)}`);
  return answer.error ? { kind: 'error', error: answer.error } : { kind: 'result', result: answer.result };
}

async function connect() {
  const client = new Client(clientInfo, { capabilities: clientCapabilities,
                                          versionNegotiation: { mode: { pin: PROTOCOL } } });
  await client.connect(new StreamableHTTPClientTransport(new URL(url),
    { requestInit: { headers: { Authorization: `Bearer ${token}` } } }));
  const { tools } = await client.listTools();
  const declarations = new Map(tools.map(tool => [tool.name, toolDeclarationFromMcpTool(tool)]));
  return { client, declarations };
}

// One task session per Client (the package allows one adapter per Client).
function session({ client, declarations }, onInputRequest) {
  return createTaskSessionFromClient(client, {
    endpointId: 'idemops-interop', rawDispatch, v2RequestFraming: { protocolVersion: PROTOCOL, clientInfo, clientCapabilities },
    tools: { currentTool: name => declarations.get(name) },
    ...(onInputRequest ? { onInputRequest } : {}),
  });
}

function outcomeOf({ outcome, lastTask }) {
  return {
    status: outcome.status,
    result: outcome.status === 'completed'
      ? { structuredContent: outcome.result.structuredContent ?? null, isError: outcome.result.isError ?? false }
      : null,
    error: outcome.status === 'failed' ? { message: outcome.error.message, code: outcome.error.code ?? null } : null,
    lastTask: lastTask ? { taskId: lastTask.taskId, status: lastTask.status } : null,
  };
}

async function run(tasks, tool, toolArguments, seen) {
  const execution = await tasks.callTool(tool, toolArguments, { task: { preference: 'prefer' } });
  const settled = await execution.settle({ onEvent: event => {
    if (event.type === 'task') seen.push(event.task.status);
  } });
  return { kind: execution.kind, taskId: execution.handle?.taskId ?? null, ...outcomeOf(settled) };
}

const connection = await connect();
const out = {
  protocol: connection.client.getProtocolEra(),
  tasksExtension: connection.client.getServerCapabilities()?.extensions?.['io.modelcontextprotocol/tasks'] ?? null,
};

switch (scenario) {
  case 'settle': {  // callTool -> a task handle -> driven (tasks/get) to its outcome
    const tasks = session(connection);
    out.capabilities = tasks.capabilities;
    out.seen = [];
    out.call = await run(tasks, args.tool, args.arguments, out.seen);
    await tasks.close();
    break;
  }
  case 'same-key': {  // the same key on another connection: one task (the idempotency extension's section 11)
    const first = session(connection);
    const one = await first.callTool(args.tool, args.arguments);
    // the first agent hands the task off and stops (without closing its session, which would cancel what it
    // still owns); a second one, on its own connection, calls again with the same key
    await one.handoff(reference => { out.reference = reference; });
    const other = await connect();
    const second = session(other);
    const again = await second.callTool(args.tool, args.arguments);
    out.kinds = [one.kind, again.kind];
    out.taskIds = [one.handle?.taskId ?? null, again.handle?.taskId ?? null];
    out.call = outcomeOf(await again.settle());
    await second.close();
    await other.client.close();
    break;
  }
  case 'input': {  // a paused task asks for input (input_required); the handler answers it (tasks/update)
    out.requests = [];
    const tasks = session(connection, async (request, context) => {
      out.requests.push({ kind: request.kind, delivery: context.delivery, scope: context.scope });
      const name = Object.keys(request.params.requestedSchema?.properties ?? {})[0];
      return { action: 'accept', content: { [name]: args.answer } };
    });
    out.seen = [];
    out.call = await run(tasks, args.tool, args.arguments, out.seen);
    await tasks.close();
    break;
  }
  case 'cancel': {  // tasks/cancel through the execution
    const tasks = session(connection);
    const execution = await tasks.callTool(args.tool, args.arguments);
    out.kind = execution.kind;
    out.taskId = execution.handle?.taskId ?? null;
    await execution.cancel();
    out.call = outcomeOf(await execution.settle());
    out.after = (await tasks.task(out.taskId).snapshot()).status;
    await tasks.close();
    break;
  }
  default:
    throw new Error(`unknown scenario ${scenario}`);
}

console.log(JSON.stringify(out));
await connection.client.close();
