// The official conformance suite sends no Authorization header: this proxy, in front of idemops's /mcp,
// adds the bearer token to every request and passes everything else through untouched (the Host and
// Origin headers the DNS-rebinding scenario sets, and SSE streams as they flow). It prints its port.
//
//   node bearer_proxy.mjs <upstream-origin> <token>
import http from 'node:http';

const [upstream, token] = process.argv.slice(2);
const target = new URL(upstream);

const server = http.createServer((req, res) => {
  const forwarded = http.request({
    hostname: target.hostname, port: target.port, path: req.url, method: req.method,
    headers: { ...req.headers, authorization: `Bearer ${token}` },
  }, answer => {
    res.writeHead(answer.statusCode, answer.headers);
    answer.pipe(res);
  });
  forwarded.on('error', () => res.destroy());
  res.on('close', () => forwarded.destroy());  // the client broke its stream: break the server's too
  req.pipe(forwarded);
});
server.listen(0, '127.0.0.1', () => console.log(server.address().port));
