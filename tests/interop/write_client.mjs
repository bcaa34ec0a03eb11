// Calls idemops's plain write tools with the TypeScript SDK's own client (@modelcontextprotocol/sdk 1.x),
// as an agent built on it would, and prints what it saw as one JSON object.
// tests/conformance/test_third_party_clients.py runs it and checks that, and the database.
//
//   node write_client.mjs <mcp-url> <token> <scenario> <json-arguments>
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const [url, token, scenario, rawArguments] = process.argv.slice(2);
const args = JSON.parse(rawArguments ?? '{}');
const EXTENSION = 'io.idemops/idempotency';

async function connect() {
  const client = new Client({ name: 'idemops-interop', version: '1.0.0' }, { capabilities: {} });
  await client.connect(new StreamableHTTPClientTransport(new URL(url),
    { requestInit: { headers: { Authorization: `Bearer ${token}` } } }));
  return client;
}

function seen(result) {
  return { structured: result.structuredContent, isError: result.isError ?? false,
           replayed: result._meta?.['io.idemops/replayed'] ?? null };
}

// One operation's call as a careful agent makes it: on its own connection, asking again with the same key
// while the answer is in_progress (after retry_after).
async function call(name, toolArguments) {
  const client = await connect();
  try {
    const answers = [];
    for (;;) {
      const result = seen(await client.callTool({ name, arguments: toolArguments }));
      answers.push(result);
      const error = result.isError ? result.structured?.error : null;
      if (error?.class !== 'in_progress') return answers;
      await new Promise(resolve => setTimeout(resolve, Math.min(1000, 1000 * (error.retry_after ?? 0.2))));
    }
  } finally {
    await client.close();
  }
}

const out = {};
switch (scenario) {
  case 'advertisement': {  // what a client reads before calling: the extension and each tool's declaration
    const client = await connect();
    out.protocol = client.transport?.protocolVersion ?? null;
    out.advertised = client.getServerCapabilities().experimental?.[EXTENSION] ?? null;
    const { tools } = await client.listTools();
    out.declared = Object.fromEntries(tools.filter(t => t._meta?.[EXTENSION]).map(t => [t.name, t._meta[EXTENSION]]));
    await client.close();
    break;
  }
  case 'storm': {  // the same call on separate connections at once
    out.calls = await Promise.all(Array.from({ length: args.count }, () => call(args.tool, args.arguments)));
    break;
  }
  case 'sequence': {  // the calls one after another, each on its own connection
    out.calls = [];
    for (const step of args.calls) out.calls.push(await call(step.tool, step.arguments));
    break;
  }
  default:
    throw new Error(`unknown scenario ${scenario}`);
}
console.log(JSON.stringify(out));
