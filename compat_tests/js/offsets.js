'use strict'
// fetchTopicOffsets (watermarks), fetchTopicOffsetsByTimestamp and
// deleteTopicRecords on a 2-partition topic it creates. Partition 0 gets 10
// records stamped BASE + 1000 * i, partition 1 gets 3 stamped BASE + 1000 * (20 + i).
// Prints BASE and every answer.
const { errorInfo, main, withAdminAndProducer } = require('./lib')

main(async ({ bootstrap, topic }) => {
  return withAdminAndProducer(bootstrap, async ({ admin, prod }) => {
    const watermarks = async () => (await admin.fetchTopicOffsets(topic))
      .sort((a, b) => a.partition - b.partition)
    const byTimestamp = async ts => (await admin.fetchTopicOffsetsByTimestamp(topic, ts))
      .sort((a, b) => a.partition - b.partition)
    await admin.createTopics({ waitForLeaders: true, topics: [{ topic, numPartitions: 2 }] })
    const empty = await watermarks()
    const base = Date.now() - 3600 * 1000
    // One record per send: each is its own batch.
    for (let i = 0; i < 10; i++) {
      await prod.send({ topic, messages: [{ partition: 0, value: `p0-${i}`, timestamp: `${base + 1000 * i}` }] })
    }
    await prod.send({
      topic,
      messages: [0, 1, 2].map(i => ({
        partition: 1, value: `p1-${i}`, timestamp: `${base + 1000 * (20 + i)}`,
      })),
    })
    const produced = await watermarks()
    const lookups = {}
    for (const [name, ts] of Object.entries({
      beforeAll: base - 1,
      first: base,
      exact5: base + 5000,
      between4and5: base + 4500,
      last: base + 9000,
      inPartition1Batch: base + 21000,
      afterAll: base + 3600 * 1000,
    })) {
      lookups[name] = await byTimestamp(ts)
    }

    const deleted = []
    const del = async (partition, offset) => {
      try {
        await admin.deleteTopicRecords({ topic, partitions: [{ partition, offset }] })
        deleted.push({ partition, offset, ok: true, watermarks: await watermarks() })
      } catch (e) {
        deleted.push({ partition, offset, ok: false, error: errorInfo(e) })
      }
    }
    await del(0, '4') // below 4 goes: low watermark 4
    await del(1, '-1') // -1: everything (the high watermark)
    await del(0, '2') // below the low watermark: nothing changes
    await del(0, '50') // past the high watermark: OFFSET_OUT_OF_RANGE
    const afterDelete = await byTimestamp(base + 1000)
    return { base, empty, produced, lookups, deleted, afterDelete }
  })
})
