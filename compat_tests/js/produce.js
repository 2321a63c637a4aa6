'use strict'
// Producer: one send() per codec named in ARGS (none, gzip, snappy, lz4, zstd)
// into a 2-partition topic it creates; each send has keyed records, headers
// (one repeated), a null value (tombstone), a null key and explicit timestamps,
// spread over both partitions in one request. Prints what was sent, the send
// results and the watermarks after (fetchTopicOffsets).
const { CODECS, main, withAdminAndProducer } = require('./lib')

main(async ({ bootstrap, topic, args }) => {
  const codecs = args.length ? args : ['none']
  return withAdminAndProducer(bootstrap, async ({ admin, prod }) => {
    await admin.createTopics({ waitForLeaders: true, topics: [{ topic, numPartitions: 2 }] })
    const base = Date.now() - 60000 // explicit, distinct, and in the past
    const sent = []
    const sends = []
    for (const [round, codec] of codecs.entries()) {
      if (!(codec in CODECS)) throw new Error(`unknown codec ${codec}`)
      const messages = []
      for (let i = 0; i < 40; i++) {
        const n = round * 40 + i
        messages.push({
          partition: i % 2,
          key: i === 7 ? null : `key-${n}`,
          value: i === 5 ? null : `${codec} value ${n} ` + 'abcdefgh'.repeat(i % 9),
          headers: { codec, index: `${n}`, multi: ['a', `b${n}`] },
          timestamp: `${base + n}`,
        })
      }
      const result = await prod.send({
        topic, acks: -1, compression: CODECS[codec], messages,
      })
      sends.push({
        codec,
        results: result
          .map(r => ({ partition: r.partition, errorCode: r.errorCode, baseOffset: r.baseOffset }))
          .sort((a, b) => a.partition - b.partition),
      })
      for (const m of messages) sent.push({ ...m, timestamp: Number(m.timestamp) })
    }
    const offsets = (await admin.fetchTopicOffsets(topic))
      .sort((a, b) => a.partition - b.partition)
    return { sends, sent, offsets }
  })
})
