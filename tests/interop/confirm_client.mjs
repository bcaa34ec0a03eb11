// A host built on the TypeScript SDK's own client (@modelcontextprotocol/sdk 1.x, protocol 2025-11-25) whose
// person is asked to confirm a call (elicitation/create on a stateful session at /mcp/session), and prints
// what it was shown and what the call answered, as one JSON object.
// tests/conformance/test_confirmation_typescript.py runs it and checks that, and the database.
//
//   node confirm_client.mjs <mcp-url> <token> <confirm|decline|none> <tool> <json-arguments>
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';

const [url, token, answer, tool, rawArguments] = process.argv.slice(2);
const shown = [];
// 'none': a host that declares no elicitation.
const capabilities = answer === 'none' ? {} : { elicitation: { form: {} } };
const client = new Client({ name: 'ts-host', version: '1.0.0' }, { capabilities });
if (answer !== 'none') {
  client.setRequestHandler(ElicitRequestSchema, async request => {
    shown.push(request.params.message);
    return answer === 'confirm' ? { action: 'accept', content: { confirm: true } } : { action: 'decline' };
  });
}
await client.connect(new StreamableHTTPClientTransport(new URL(url),
  { requestInit: { headers: { Authorization: `Bearer ${token}` } } }));
try {
  const result = await client.callTool({ name: tool, arguments: JSON.parse(rawArguments) });
  console.log(JSON.stringify({ shown, structured: result.structuredContent, isError: result.isError ?? false }));
} finally {
  await client.close();
}
