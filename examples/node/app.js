#!/usr/bin/env node
// An order service behind dlq-sidecar, Node.js standard library only.
//
// The sidecar POSTs each Kafka record to /records: the body is the record value, metadata comes in
// Kafka-* headers. This app decides by the order's "kind":
//
//   ok      accept
//   poison  reject with error class OrderValidationError (the sidecar writes it to the DLQ)
//   flaky   release with retry_after_ms 100 while Kafka-Delivery-Count <= fails (default 2),
//           then accept; an order whose "fails" reaches the sidecar's delivery limit is archived
//   slow    answer 202 now, accept later through the sidecar's POST /v1/acks (SIDECAR_API)
//
//   node app.js [--host 127.0.0.1] [--port 8080] [--unix PATH] [--quiet]
//
// SIDECAR_API is http://host:port (default http://127.0.0.1:8787) or unix:/path/to/api.sock.
// Each decision is logged as one line: order=<id> kind=<kind> delivery=<n> answer=<ack>.
'use strict';

const fs = require('node:fs');
const http = require('node:http');
const { parseArgs } = require('node:util');

const SIDECAR_API = (process.env.SIDECAR_API || 'http://127.0.0.1:8787').replace(/\/+$/, '');
const SLOW_ACK_DELAY_MS = 200;
const RETRY_AFTER_MS = 100;

const { values: args } = parseArgs({
  options: {
    host: { type: 'string', default: '127.0.0.1' },
    port: { type: 'string', default: process.env.PORT || '8080' },
    unix: { type: 'string' },
    quiet: { type: 'boolean', default: false },
  },
});

function log(line) {
  if (!args.quiet) process.stdout.write(line + '\n');
}

class OrderValidationError extends Error {
  constructor(message) {
    super(message);
    this.name = 'OrderValidationError';
  }
}

function validate(order) {
  // A real service would check the order here; a "poison" order always fails.
  if (order.kind === 'poison') {
    throw new OrderValidationError(`order ${order.id}: quantity must be positive`);
  }
}

// Where POST /v1/acks goes: a TCP URL, or a Unix socket when SIDECAR_API is unix:/path.
function ackTarget() {
  if (SIDECAR_API.startsWith('unix:')) {
    return { socketPath: SIDECAR_API.slice('unix:'.length), path: '/v1/acks' };
  }
  const url = new URL('/v1/acks', SIDECAR_API + '/');
  return { host: url.hostname, port: url.port || 80, path: url.pathname };
}

// Answer a deferred delivery through the sidecar's local API. If this fails, the record is not
// lost: the sidecar redelivers it when its lock expires.
function ackLater(deliveryId, orderId) {
  const body = JSON.stringify({ acks: [{ id: deliveryId, ack: 'accept' }] });
  const req = http.request(
    {
      ...ackTarget(),
      method: 'POST',
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) },
      timeout: 5000,
    },
    (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        let result = `status ${res.statusCode}`;
        try {
          result = JSON.parse(Buffer.concat(chunks)).results[0].result;
        } catch (_) {
          // keep the status as the result
        }
        log(`order=${orderId} acked=accept result=${result}`);
      });
    },
  );
  req.on('timeout', () => req.destroy(new Error('timeout')));
  req.on('error', (err) => log(`order=${orderId} acked=accept error=${err.message}`));
  req.end(body);
}

// [status, JSON answer] for one order; a null answer means "no body".
function decide(order, delivery, deliveryId) {
  if (order.kind === 'flaky') {
    const fails = Number.isInteger(order.fails) ? order.fails : 2;
    if (delivery <= fails) {
      return [
        200,
        {
          ack: 'release',
          retry_after_ms: RETRY_AFTER_MS,
          error: {
            class: 'InventoryUnavailable',
            message: `inventory service timed out (delivery ${delivery})`,
          },
        },
      ];
    }
    return [200, { ack: 'accept' }];
  }
  if (order.kind === 'slow') {
    setTimeout(ackLater, SLOW_ACK_DELAY_MS, deliveryId, order.id);
    return [202, null];
  }
  try {
    validate(order);
  } catch (err) {
    if (!(err instanceof OrderValidationError)) throw err;
    return [200, { ack: 'reject', error: { class: err.name, message: err.message, stacktrace: err.stack } }];
  }
  return [200, { ack: 'accept' }];
}

function reply(res, status, answer) {
  const data = answer ? Buffer.from(JSON.stringify(answer)) : Buffer.alloc(0);
  const headers = { 'Content-Length': data.length };
  if (answer) headers['Content-Type'] = 'application/json';
  res.writeHead(status, headers);
  res.end(data);
}

const server = http.createServer((req, res) => {
  if (req.method === 'GET') {
    reply(res, req.url === '/healthz' ? 200 : 404, req.url === '/healthz' ? { status: 'ok' } : { error: 'not found' });
    return;
  }
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const delivery = parseInt(req.headers['kafka-delivery-count'] || '1', 10);
    const deliveryId = req.headers['kafka-delivery-id'] || '';
    let order;
    try {
      order = JSON.parse(Buffer.concat(chunks).toString('utf8'));
      if (order === null || typeof order !== 'object' || Array.isArray(order)) {
        throw new Error('an order is a JSON object');
      }
    } catch (err) {
      log(`order=? kind=? delivery=${delivery} answer=reject`);
      reply(res, 200, { ack: 'reject', error: { class: 'OrderParseError', message: err.message } });
      return;
    }
    const [status, answer] = decide(order, delivery, deliveryId);
    log(`order=${order.id} kind=${order.kind} delivery=${delivery} answer=${answer ? answer.ack : 'deferred'}`);
    reply(res, status, answer);
  });
});

function listening() {
  const where = args.unix ? `unix:${args.unix}` : `http://${args.host}:${server.address().port}`;
  console.log(`order service listening on ${where} (sidecar API ${SIDECAR_API})`);
}

if (args.unix) {
  fs.rmSync(args.unix, { force: true }); // a socket left behind by an earlier run
  server.listen(args.unix, listening);
} else {
  server.listen(parseInt(args.port, 10), args.host, listening);
}

function stop() {
  // Stop taking connections; idle keep-alive connections would otherwise hold the process open.
  server.close(() => process.exit(0));
  server.closeAllConnections();
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
