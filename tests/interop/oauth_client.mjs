// Connects to idemops by OAuth with the TypeScript SDK's own client auth (@modelcontextprotocol/sdk 1.x), as
// an MCP host built on it would, then calls one tool. tests/access/test_oauth_sdk_clients.py runs it:
//
//   node oauth_client.mjs <mcp-url> <redirect-url> <tool> <json-arguments>
//
// It prints {"authorize": <url>} when it would send its person to the browser, reads the authorization code
// (one line) on stdin once the person has consented, and prints {"result": <the call's structured content>}.
import { createInterface } from 'node:readline';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { UnauthorizedError } from '@modelcontextprotocol/sdk/client/auth.js';

const [url, redirect, tool, rawArguments] = process.argv.slice(2);
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const say = value => process.stdout.write(JSON.stringify(value) + '\n');

const stored = {};
const provider = {
  get redirectUrl() { return redirect; },
  get clientMetadata() {
    return { client_name: 'typescript-sdk host', redirect_uris: [redirect], grant_types: ['authorization_code', 'refresh_token'],
             response_types: ['code'], token_endpoint_auth_method: 'none' };
  },
  clientInformation: () => stored.client,
  saveClientInformation: info => { stored.client = info; },
  tokens: () => stored.tokens,
  saveTokens: tokens => { stored.tokens = tokens; },
  redirectToAuthorization: authorizationUrl => say({ authorize: authorizationUrl.toString() }),
  saveCodeVerifier: verifier => { stored.verifier = verifier; },
  codeVerifier: () => stored.verifier,
};

const transport = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider });
const client = new Client({ name: 'idemops-oauth-interop', version: '1.0.0' }, { capabilities: {} });
try {
  await client.connect(transport);
} catch (error) {
  if (!(error instanceof UnauthorizedError)) throw error;
  const { value: code } = await lines.next();
  await transport.finishAuth(code.trim());
  await client.connect(new StreamableHTTPClientTransport(new URL(url), { authProvider: provider }));
}
const result = await client.callTool({ name: tool, arguments: JSON.parse(rawArguments) });
say({ result: result.structuredContent ?? null, isError: result.isError ?? false });
await client.close();
process.exit(0);
