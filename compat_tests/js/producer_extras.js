'use strict'
// Producer edge cases on a topic it creates with max.message.bytes=2097152:
// acks=0 (no answer) followed by acks=1 on the same connection, a 1 MiB
// record, a record over max.message.bytes (MESSAGE_TOO_LARGE), and
// createPartitions (seen by fetchTopicMetadata).
const { errorInfo, main, withAdminAndProducer } = require('./lib')

main(async ({ bootstrap, topic }) => {
  return withAdminAndProducer(bootstrap, async ({ admin, prod }) => {
    await admin.createTopics({
      waitForLeaders: true,
      topics: [{ topic, configEntries: [{ name: 'max.message.bytes', value: '2097152' }] }],
    })
    const acks0 = await prod.send({ topic, acks: 0, messages: [{ value: 'a0' }, { value: 'a1' }] })
    const acks1 = await prod.send({ topic, acks: 1, messages: [{ value: 'b0' }] })
    const big = await prod.send({
      topic, messages: [{ key: 'big', value: Buffer.alloc(1 << 20, 'x') }],
    })
    let tooLarge = null
    try {
      await prod.send({ topic, messages: [{ value: Buffer.alloc(3 << 20, 'y') }] })
    } catch (e) {
      tooLarge = errorInfo(e)
    }
    await admin.createPartitions({ topicPartitions: [{ topic, count: 3 }] })
    const metadata = await admin.fetchTopicMetadata({ topics: [topic] })
    const offsets = (await admin.fetchTopicOffsets(topic)).sort((a, b) => a.partition - b.partition)
    const baseOffsets = r => r.map(x => ({ partition: x.partition, errorCode: x.errorCode,
      baseOffset: x.baseOffset }))
    return {
      acks0,
      acks1: baseOffsets(acks1),
      big: baseOffsets(big),
      tooLarge,
      partitions: metadata.topics[0].partitions.map(p => p.partitionId).sort(),
      offsets,
    }
  })
})
