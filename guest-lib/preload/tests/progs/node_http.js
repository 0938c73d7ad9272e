// An HTTP pair on Node.js (libuv: epoll).
//
//   node node_http.js server PORT N       answer each POST with its body's
//                                         length and sha256; exit after N
//   node node_http.js client HOST PORT N  N POSTs of random bodies (0 to
//                                         300,000 bytes), 8 keep-alive
//                                         connections; every answer checked
'use strict';
const http = require('http');
const crypto = require('crypto');

const [mode, ...args] = process.argv.slice(2);

function digest(buf) {
  return crypto.createHash('sha256').update(buf).digest('hex');
}

if (mode === 'server' && args.length === 2) {
  const n = Number(args[1]);
  let served = 0;
  const server = http.createServer((req, res) => {
    const parts = [];
    req.on('data', (d) => parts.push(d));
    req.on('end', () => {
      const body = Buffer.concat(parts);
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ len: body.length, sha: digest(body) }));
      if (++served === n) {
        res.on('finish', () => {
          server.close();
          server.closeAllConnections();
          console.log(`ok node server: ${n} requests answered`);
        });
      }
    });
  });
  server.listen(Number(args[0]), '0.0.0.0', () => console.log('ready'));
} else if (mode === 'client' && args.length === 3) {
  const [host, port, n] = [args[0], Number(args[1]), Number(args[2])];
  const agent = new http.Agent({ keepAlive: true, maxSockets: 8 });
  let bytes = 0;
  const one = (i) => new Promise((resolve, reject) => {
    const body = crypto.randomBytes((i * 7919) % 300001);
    const req = http.request({ host, port, method: 'POST', path: `/${i}`, agent,
      headers: { 'content-length': body.length } }, (res) => {
      const parts = [];
      res.on('data', (d) => parts.push(d));
      res.on('end', () => {
        const got = JSON.parse(Buffer.concat(parts).toString());
        if (res.statusCode !== 200 || got.len !== body.length || got.sha !== digest(body)) {
          reject(new Error(`request ${i}: sent ${body.length}, answer ${JSON.stringify(got)}`));
        } else {
          bytes += body.length;
          resolve();
        }
      });
    });
    req.on('error', reject);
    req.end(body);
  });
  Promise.all([...Array(n).keys()].map(one)).then(() => {
    agent.destroy();
    console.log(`ok node client: ${n} requests, ${bytes} bytes checked`);
  }, (e) => {
    console.log(`fail ${e.message}`);
    process.exit(1);
  });
} else {
  console.error('usage: node_http.js server PORT N | client HOST PORT N');
  process.exit(2);
}
