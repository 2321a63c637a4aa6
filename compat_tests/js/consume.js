'use strict'
// The kafkajs consumer, which is always a group member (FindCoordinator,
// JoinGroup, SyncGroup, Heartbeat, OffsetFetch/OffsetCommit, LeaveGroup).
//
//   node consume.js BOOTSTRAP TOPIC earliest COUNT
//       fromBeginning: true; read COUNT records, then the group's committed offsets.
//   node consume.js BOOTSTRAP TOPIC latest
//       fromBeginning: false on a topic that has records; once the group is
//       joined, produce "new-N" records (one every 500 ms) until one arrives.
//   node consume.js BOOTSTRAP TOPIC timestamp TS COUNT
//       seek every partition to fetchTopicOffsetsByTimestamp(TS), read COUNT records.
//   node consume.js BOOTSTRAP TOPIC longpoll
//       empty topic, maxWaitTimeInMs 20000: once a fetch is parked, stay idle
//       for 3 s, then produce one record and time its arrival. The consumer is
//       not stopped (stop() would wait out the next parked fetch).
//
// A consumer crash (e.g. the broker lacks the group APIs) fails the script.
const { errorInfo, kafka, main, message, producer, sleep, until } = require('./lib')

const LONG_POLL_MS = 20000

main(async ({ bootstrap, topic, args }) => {
  const [mode, ...rest] = args
  const client = kafka(bootstrap)
  const groupId = `${topic}-${mode}-group`
  const consumer = client.consumer({
    groupId,
    maxWaitTimeInMs: mode === 'longpoll' ? LONG_POLL_MS : 1000,
    retry: { retries: 5, initialRetryTime: 200, restartOnFailure: async () => false },
  })
  const admin = client.admin()
  const prod = producer(client)

  const received = []
  let crashed = null
  let joined = null
  let fetchStarts = 0
  let fetchesDone = 0
  consumer.on(consumer.events.CRASH, e => { crashed = e.payload.error })
  consumer.on(consumer.events.GROUP_JOIN, e => { joined = e.payload })
  consumer.on(consumer.events.FETCH_START, () => { fetchStarts++ })
  consumer.on(consumer.events.FETCH, () => { fetchesDone++ })
  const checkCrash = () => {
    if (crashed) throw Object.assign(new Error(`consumer crashed: ${crashed.message}`),
      { cause: crashed, info: errorInfo(crashed) })
  }
  const waitFor = (check, what, ms = 45000) => until(() => {
    checkCrash()
    return check()
  }, ms, what)

  await admin.connect()
  await prod.connect()
  await consumer.connect()
  const result = { mode, groupId }
  try {
    let seekTo = null
    if (mode === 'timestamp') {
      seekTo = await admin.fetchTopicOffsetsByTimestamp(topic, Number(rest[0]))
      result.seekTo = seekTo
    }
    await consumer.subscribe({ topics: [topic], fromBeginning: mode !== 'latest' && mode !== 'timestamp' })
    await consumer.run({
      eachMessage: async ({ topic: t, partition, message: m }) => {
        received.push(message(t, partition, m))
      },
    })
    if (seekTo) {
      checkCrash() // seek() on a consumer whose run() crashed only says "not initialized"
      for (const { partition, offset } of seekTo) consumer.seek({ topic, partition, offset })
    }
    await waitFor(() => joined !== null, 'the group join')
    result.memberId = joined.memberId
    result.assigned = joined.memberAssignment

    if (mode === 'earliest' || mode === 'timestamp') {
      const count = Number(mode === 'earliest' ? rest[0] : rest[1])
      await waitFor(() => received.length >= count, `${count} records`)
    } else if (mode === 'latest') {
      const sent = []
      await waitFor(async () => {
        if (received.length) return true
        const value = `new-${sent.length}`
        await prod.send({ topic, messages: [{ value }] })
        sent.push(value)
        await sleep(500)
        return received.length > 0
      }, 'a record produced after the join')
      result.sent = sent
    } else if (mode === 'longpoll') {
      await waitFor(() => fetchStarts > 0, 'the first fetch')
      await sleep(1000) // the fetch reaches the gateway and parks there
      const before = fetchesDone
      await sleep(3000)
      result.fetchesDuringIdle = fetchesDone - before
      const started = Date.now()
      await prod.send({ topic, messages: [{ value: 'wake-up' }] })
      await waitFor(() => received.length > 0, 'the record produced during the long poll')
      result.elapsedMs = Date.now() - started
      result.maxWaitMs = LONG_POLL_MS
    } else {
      throw new Error(`unknown mode ${mode}`)
    }
    result.received = [...received]
    if (mode === 'longpoll') return result
    await consumer.stop() // commits what was processed
    result.committed = (await admin.fetchOffsets({ groupId, topics: [topic] }))
      .flatMap(t => t.partitions.map(p => ({ partition: p.partition, offset: p.offset })))
      .sort((a, b) => a.partition - b.partition)
    return result
  } finally {
    if (mode !== 'longpoll') await consumer.disconnect().catch(() => {})
    await prod.disconnect()
    await admin.disconnect()
  }
}, { deadlineMs: 90000 })
