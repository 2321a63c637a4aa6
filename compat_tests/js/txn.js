'use strict'
// kafkajs idempotent and transactional producers, one scenario per run:
//
//   node txn.js BOOTSTRAP TOPIC SCENARIO [ARGS...]
//
// SCENARIO is one of the functions in SCENARIOS below. A scenario that needs
// the test to look at the gateway mid-way prints `PAUSE <what>` on stdout and
// waits for a line on stdin. The last stdout line is the JSON result.
const readline = require('readline')
const { errorInfo, kafka, main, message, sleep } = require('./lib')

const PER_PARTITION = 4 // records per partition per transaction (txn_helpers.PER_PARTITION)

let stdinLines = null
// Let the test act (e.g. read the stored log) before going on.
async function pause(what) {
  stdinLines = stdinLines ||
    readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]()
  process.stdout.write(`PAUSE ${what}\n`)
  const { done } = await stdinLines.next()
  if (done) throw new Error(`stdin closed while paused at ${what}`)
}

async function connected(client, options) {
  const p = client.producer({ maxInFlightRequests: 1, idempotent: true, ...options })
  await p.connect()
  return p
}

// Read every partition of the topics from the beginning with a group consumer
// (kafkajs has no other): COUNT records, then LINGER ms more so that a record
// too many is seen too. readUncommitted picks the isolation level.
async function readAll(client, topics, count, readUncommitted, lingerMs = 1000) {
  const consumer = client.consumer({
    groupId: `reader-${Math.random().toString(16).slice(2)}`,
    readUncommitted,
    maxWaitTimeInMs: 100,
    retry: { retries: 5, initialRetryTime: 200, restartOnFailure: async () => false },
  })
  const received = []
  await consumer.connect()
  try {
    await consumer.subscribe({ topics, fromBeginning: true })
    await consumer.run({
      eachMessage: async ({ topic, partition, message: m }) => {
        received.push(message(topic, partition, m))
      },
    })
    const deadline = Date.now() + 30000
    while (received.length < count && Date.now() < deadline) await sleep(50)
    await sleep(lingerMs)
  } finally {
    await consumer.disconnect()
  }
  return received.map(m => [m.topic, m.partition, m.offset, m.value])
}

// The scenario's topics (txn_helpers.topic_names): TOPIC-a (3 partitions), TOPIC-b (2).
function scenarioTopics(base) {
  return { [`${base}-a`]: 3, [`${base}-b`]: 2 }
}

function txnMessages(tag, topics) {
  return Object.entries(topics).map(([topic, count]) => ({
    topic,
    messages: [...Array(count).keys()].flatMap(partition =>
      [...Array(PER_PARTITION).keys()].map(i =>
        ({ partition, value: `${tag}:${topic}:${partition}:${i}` }))),
  }))
}

function reported(results) {
  return results.map(r => [r.topicName, r.partition, Number(r.baseOffset)])
    .sort((a, b) => (a[0] + a[1]).localeCompare(b[0] + b[1]))
}

async function attempt(fn) {
  try {
    return { ok: true, value: await fn() }
  } catch (e) {
    return { ok: false, error: errorInfo(e) }
  }
}

async function createTopics(client, topics) {
  const admin = client.admin()
  await admin.connect()
  try {
    await admin.createTopics({
      waitForLeaders: true,
      topics: Object.entries(topics).map(([topic, numPartitions]) => ({ topic, numPartitions })),
    })
  } finally {
    await admin.disconnect()
  }
}

async function committedOffset(client, groupId, topic) {
  const admin = client.admin()
  await admin.connect()
  try {
    const [answer] = await admin.fetchOffsets({ groupId, topics: [topic] })
    return Number(answer.partitions.find(p => p.partition === 0).offset)
  } finally {
    await admin.disconnect()
  }
}

const SCENARIOS = {
  // The idempotent producer (idempotent: true; kafkajs' default is false).
  async idempotent(client, topic) {
    await createTopics(client, { [topic]: 2 })
    const p = await connected(client)
    const sends = []
    try {
      for (let round = 0; round < 5; round++) {
        const messages = [...Array(40).keys()].map(i => ({
          partition: i % 2, value: `idem-${round * 40 + i}`,
        }))
        sends.push(reported(await p.send({ topic, messages })))
      }
    } finally {
      await p.disconnect()
    }
    return { sends, read: await readAll(client, [topic], 200, true, 500) }
  },

  // c1 committed, a2 aborted, o3 left open while both isolation levels read,
  // then committed and read again.
  async commitAbort(client, base) {
    const topics = scenarioTopics(base)
    const names = Object.keys(topics)
    const records = Object.values(topics).reduce((n, c) => n + c * PER_PARTITION, 0)
    await createTopics(client, topics)
    const p = await connected(client, { transactionalId: `ca-${base}` })
    const result = { reported: {} }
    try {
      let open = null
      for (const [tag, outcome] of [['c1', 'commit'], ['a2', 'abort'], ['o3', 'open']]) {
        const txn = await p.transaction()
        const sent = await txn.sendBatch({ topicMessages: txnMessages(tag, topics) })
        result.reported[tag] = reported(sent)
        if (outcome === 'commit') await txn.commit()
        else if (outcome === 'abort') await txn.abort()
        else open = txn
      }
      result.openCommitted = await readAll(client, names, records, false)
      result.openUncommitted = await readAll(client, names, records, true)
      await open.commit()
    } finally {
      await p.disconnect()
    }
    result.committed = await readAll(client, names, 2 * records, false, 300)
    result.uncommitted = await readAll(client, names, 2 * records, true, 300)
    return result
  },

  // sendOffsets moves the group's offset only on commit (admin.fetchOffsets:
  // no require_stable); PAUSE while the transaction holding offsets is open.
  async sendOffsets(client, topic, groupId) {
    const source = `${topic}-in`
    const output = `${topic}-out`
    await createTopics(client, { [source]: 1, [output]: 1 })
    const plain = client.producer()
    await plain.connect()
    await plain.send({
      topic: source,
      messages: [...Array(10).keys()].map(i => ({ partition: 0, value: `in-${i}` })),
    })
    await plain.disconnect()
    const offsets = {
      consumerGroupId: groupId,
      topics: [{ topic: source, partitions: [{ partition: 0, offset: '6' }] }],
    }
    const p = await connected(client, { transactionalId: `so-${topic}` })
    const fetched = { before: await committedOffset(client, groupId, source) }
    try {
      const aborted = await p.transaction()
      await aborted.send({ topic: output, messages: [{ partition: 0, value: 'aborted' }] })
      await aborted.sendOffsets(offsets)
      fetched.openAborted = await committedOffset(client, groupId, source)
      await aborted.abort()
      fetched.afterAbort = await committedOffset(client, groupId, source)
      const txn = await p.transaction()
      await txn.send({
        topic: output,
        messages: [...Array(6).keys()].map(i => ({ partition: 0, value: `out-${i}` })),
      })
      await txn.sendOffsets(offsets)
      fetched.open = await committedOffset(client, groupId, source)
      await pause('offsets-pending')
      await txn.commit()
      fetched.afterCommit = await committedOffset(client, groupId, source)
    } finally {
      await p.disconnect()
    }
    return { fetched, output: await readAll(client, [output], 6, false) }
  },

  // Two producers with one transactionalId: the second one fences the first.
  async zombie(client, topic) {
    await createTopics(client, { [topic]: 2 })
    const transactionalId = `zombie-${topic}`
    const zombie = await connected(client, { transactionalId })
    const result = {}
    try {
      const open = await zombie.transaction()
      await open.send({
        topic, messages: [0, 1].map(partition => ({ partition, value: `zombie-${partition}` })),
      })
      const successor = await connected(client, { transactionalId })
      try {
        const txn = await successor.transaction()
        result.zombieSend = await attempt(() =>
          open.send({ topic, messages: [{ partition: 0, value: 'zombie-late' }] }))
        result.zombieCommit = await attempt(() => open.commit())
        await txn.send({ topic, messages: [{ partition: 0, value: 'successor' }] })
        await txn.commit()
      } finally {
        await successor.disconnect()
      }
    } finally {
      await zombie.disconnect()
    }
    result.committed = await readAll(client, [topic], 1, false)
    result.uncommitted = await readAll(client, [topic], 1, true)
    return result
  },

  // Two transactionalIds commit offset 10 of one group partition; the winner
  // first. WHEN: the loser sends its offsets before or after the winner commits.
  async conflict(client, topic, groupId, when) {
    const source = `${topic}-in`
    const output = `${topic}-out`
    await createTopics(client, { [source]: 1, [output]: 1 })
    const offsets = {
      consumerGroupId: groupId,
      topics: [{ topic: source, partitions: [{ partition: 0, offset: '10' }] }],
    }
    const loserId = `lose-${topic}`
    const winner = await connected(client, { transactionalId: `win-${topic}` })
    const loser = await connected(client, { transactionalId: loserId })
    const result = {}
    try {
      const w = await winner.transaction()
      const l = await loser.transaction()
      await w.send({ topic: output, messages: [{ partition: 0, value: 'winner' }] })
      await l.send({ topic: output, messages: [{ partition: 0, value: 'loser' }] })
      await w.sendOffsets(offsets)
      if (when === 'before') await l.sendOffsets(offsets)
      await w.commit()
      if (when === 'after') result.sendOffsets = await attempt(() => l.sendOffsets(offsets))
      if (result.sendOffsets && !result.sendOffsets.ok) {
        result.abort = await attempt(() => l.abort())
      } else {
        result.commit = await attempt(() => l.commit())
        if (!result.commit.ok) result.abort = await attempt(() => l.abort())
      }
      // The same producer's next transaction, if kafkajs lets it have one.
      result.next = await attempt(async () => {
        const next = await loser.transaction()
        await next.send({ topic: output, messages: [{ partition: 0, value: 'loser-next' }] })
        await next.commit()
      })
    } finally {
      await winner.disconnect()
      await loser.disconnect()
    }
    if (!result.next.ok) { // a new producer with the same transactionalId goes on
      const successor = await connected(client, { transactionalId: loserId })
      try {
        const next = await successor.transaction()
        await next.send({ topic: output, messages: [{ partition: 0, value: 'loser-next' }] })
        await next.commit()
      } finally {
        await successor.disconnect()
      }
    }
    result.output = await readAll(client, [output], 2, false)
    return result
  },

  // transactionTimeout 2000: PAUSE until the gateway aborted it, then commit.
  async timeout(client, topic, transactionalId) {
    await createTopics(client, { [topic]: 1 })
    const p = await connected(client, { transactionalId, transactionTimeout: 2000 })
    try {
      const txn = await p.transaction()
      await txn.send({ topic, messages: [{ partition: 0, value: 'late' }] })
      await pause('timed-out')
      return { commit: await attempt(() => txn.commit()) }
    } finally {
      await p.disconnect()
    }
  },

  // A transaction past the gateway's gateway.txn.max.bytes: SENDS sends of one
  // SIZE-byte record each (awaited one by one) until one fails; then, as an
  // application does, abort (kafkajs would send EndTxn(commit) if told to
  // commit), and a next transaction of one record "next".
  async overLimit(client, topic, size, sends) {
    await createTopics(client, { [topic]: 1 })
    const p = await connected(client, { transactionalId: `limit-${topic}` })
    try {
      const txn = await p.transaction()
      const sent = []
      for (let i = 0; i < Number(sends) && sent.every(r => r.ok); i++) {
        sent.push(await attempt(() =>
          txn.send({ topic, messages: [{ partition: 0, value: 'v'.repeat(Number(size)) }] })))
      }
      const abort = await attempt(() => txn.abort())
      const next = await attempt(async () => {
        const again = await p.transaction()
        await again.send({ topic, messages: [{ partition: 0, value: 'next' }] })
        await again.commit()
      })
      return { sent: sent.map(r => (r.ok ? 'ok' : r.error)), abort, next }
    } finally {
      await p.disconnect()
    }
  },
}

main(async ({ bootstrap, topic, args }) => {
  const [scenario, ...rest] = args
  if (!(scenario in SCENARIOS)) throw new Error(`unknown scenario ${scenario}`)
  return SCENARIOS[scenario](kafka(bootstrap), topic, ...rest)
}, { deadlineMs: 120000 })
