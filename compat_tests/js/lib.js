'use strict'
// Shared by the kafkajs compat scripts: a client for the gateway, the codecs,
// and main(), which runs a script with a deadline and prints its JSON result.
//
// Every script is run as `node SCRIPT.js BOOTSTRAP TOPIC [ARGS...]`, prints one
// JSON document on stdout and exits 0, or prints the error on stderr and exits
// non-zero. kafkajs logs go to stderr, so stdout stays one JSON document.

const {
  Kafka,
  logLevel,
  CompressionTypes,
  CompressionCodecs,
  Partitioners,
  ConfigResourceTypes,
} = require('kafkajs')

// kafkajs has None and GZIP built in; the others come from codec packages.
CompressionCodecs[CompressionTypes.Snappy] = require('kafkajs-snappy')
const LZ4Codec = require('kafkajs-lz4')
CompressionCodecs[CompressionTypes.LZ4] = new LZ4Codec().codec
// @sensejs/kafkajs-zstd-support registers ZSTD when imported. Its CommonJS build
// (0.11.0) is broken (it uses TypeScript helpers it never defines), so main()
// loads its ES module build, which works, before running a script.
const registerZstd = () => import('@sensejs/kafkajs-zstd-support')

const CODECS = {
  none: CompressionTypes.None,
  gzip: CompressionTypes.GZIP,
  snappy: CompressionTypes.Snappy,
  lz4: CompressionTypes.LZ4,
  zstd: CompressionTypes.ZSTD,
}

const LEVELS = { [logLevel.ERROR]: 'ERROR', [logLevel.WARN]: 'WARN', [logLevel.INFO]: 'INFO' }

const stderrLogger = () => ({ namespace, level, log }) => {
  const { message, ...extra } = log
  process.stderr.write(`[kafkajs ${LEVELS[level] || level}] ${namespace}: ${message} ` +
    `${JSON.stringify(extra)}\n`)
}

// extra: more Kafka() settings, e.g. ssl and sasl (secure.js).
function kafka(bootstrap, clientId = 'gateway-compat', extra = {}) {
  return new Kafka({
    ...extra,
    clientId,
    brokers: [bootstrap],
    logLevel: process.env.KAFKAJS_LOG_LEVEL === 'debug' ? logLevel.DEBUG : logLevel.WARN,
    logCreator: stderrLogger,
    connectionTimeout: 5000,
    requestTimeout: 15000,
    retry: { retries: 5, initialRetryTime: 200, maxRetryTime: 2000 },
  })
}

function producer(client) {
  return client.producer({ createPartitioner: Partitioners.DefaultPartitioner })
}

// Run fn({ admin, prod }) with an admin client and a producer, both connected,
// and disconnect them afterwards whatever happens.
async function withAdminAndProducer(bootstrap, fn) {
  const client = kafka(bootstrap)
  const admin = client.admin()
  const prod = producer(client)
  await admin.connect()
  await prod.connect()
  try {
    return await fn({ admin, prod })
  } finally {
    await prod.disconnect()
    await admin.disconnect()
  }
}

// Buffers as UTF-8 strings (null stays null), header values likewise.
function text(buffer) {
  return buffer == null ? null : buffer.toString('utf8')
}

function headers(h) {
  const out = {}
  for (const [key, value] of Object.entries(h || {})) {
    out[key] = Array.isArray(value) ? value.map(text) : text(value)
  }
  return out
}

function message(topic, partition, m) {
  return {
    topic,
    partition,
    offset: Number(m.offset),
    timestamp: Number(m.timestamp),
    key: text(m.key),
    value: text(m.value),
    headers: headers(m.headers),
  }
}

// Errors as data: the type kafkajs gives a broker error code (or its class).
function errorInfo(e) {
  return {
    name: e.name,
    type: e.type || null,
    message: e.message,
    errors: (e.errors || []).map(x => ({ type: x.type || null, message: x.message })),
    // Per-partition broker errors (deleteTopicRecords), also when wrapped by a retrier.
    partitions: (e.partitions || (e.cause && e.cause.partitions) || [])
      .map(p => ({ partition: p.partition, type: p.error ? p.error.type || null : null })),
    // Per-group broker errors (deleteGroups' KafkaJSDeleteGroupsError).
    groups: (e.groups || []).map(g => ({ groupId: g.groupId, errorCode: g.errorCode ?? null,
      type: g.error ? g.error.type || null : null })),
  }
}

function sleep(ms) {
  return new Promise(resolve => setTimeout(resolve, ms))
}

// Resolves once check() is true, polling; rejects after timeoutMs.
async function until(check, timeoutMs, what) {
  const deadline = Date.now() + timeoutMs
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(100)
  }
}

// Run fn({bootstrap, topic, args}) with a deadline; print its result as JSON.
function main(fn, { deadlineMs = 60000 } = {}) {
  const [bootstrap, topic, ...args] = process.argv.slice(2)
  if (!bootstrap || !topic) {
    process.stderr.write('usage: node SCRIPT.js BOOTSTRAP TOPIC [ARGS...]\n')
    process.exit(2)
  }
  const timer = setTimeout(() => {
    process.stderr.write(`deadline of ${deadlineMs} ms passed\n`)
    process.exit(3)
  }, deadlineMs)
  registerZstd()
    .then(() => fn({ bootstrap, topic, args }))
    .then(result => {
      clearTimeout(timer)
      process.stdout.write(JSON.stringify(result) + '\n', () => process.exit(0))
    })
    .catch(e => {
      process.stderr.write(`${e && e.stack ? e.stack : e}\n`)
      if (e && (e.errors || e.groups)) process.stderr.write(`errors: ${JSON.stringify(errorInfo(e))}\n`)
      process.exit(1)
    })
}

module.exports = {
  CODECS,
  ConfigResourceTypes,
  errorInfo,
  headers,
  kafka,
  main,
  message,
  producer,
  sleep,
  text,
  until,
  withAdminAndProducer,
}
