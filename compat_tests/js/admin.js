'use strict'
// Admin: createTopics (partitions, configEntries, errors), listTopics,
// fetchTopicMetadata, describeCluster, deleteTopics.
const { ConfigResourceTypes, errorInfo, kafka, main } = require('./lib')

main(async ({ bootstrap, topic }) => {
  const admin = kafka(bootstrap).admin()
  await admin.connect()
  try {
    const create = partitions => admin.createTopics({
      waitForLeaders: true,
      topics: [{
        topic,
        numPartitions: partitions,
        configEntries: [
          { name: 'retention.ms', value: '3600000' },
          { name: 'max.message.bytes', value: '2097152' },
          { name: 'cleanup.policy', value: 'delete' },
        ],
      }],
    })
    const created = await create(3)
    const createdAgain = await create(3) // false: it exists already

    let badReplication = null
    try {
      await admin.createTopics({ topics: [{ topic: `${topic}-rf3`, replicationFactor: 3 }] })
    } catch (e) {
      badReplication = errorInfo(e)
    }

    const metadata = await admin.fetchTopicMetadata({ topics: [topic] })
    const cluster = await admin.describeCluster()
    const configs = await admin.describeConfigs({
      includeSynonyms: false,
      resources: [{
        type: ConfigResourceTypes.TOPIC,
        name: topic,
        configNames: ['retention.ms', 'max.message.bytes', 'cleanup.policy', 'segment.bytes'],
      }],
    })

    const doomed = `${topic}-doomed`
    await admin.createTopics({ waitForLeaders: true, topics: [{ topic: doomed }] })
    const listedBefore = await admin.listTopics()
    await admin.deleteTopics({ topics: [doomed] })
    const listedAfter = await admin.listTopics()

    return {
      created,
      createdAgain,
      badReplication,
      topics: metadata.topics.map(t => ({
        name: t.name,
        partitions: t.partitions
          .map(p => ({
            partitionId: p.partitionId,
            partitionErrorCode: p.partitionErrorCode,
            leader: p.leader,
            replicas: p.replicas,
            isr: p.isr,
          }))
          .sort((a, b) => a.partitionId - b.partitionId),
      })),
      cluster,
      configs: configs.resources.map(r => ({
        errorCode: r.errorCode,
        resourceName: r.resourceName,
        entries: Object.fromEntries(r.configEntries.map(c => [c.configName, {
          value: c.configValue,
          isDefault: c.isDefault,
          source: c.configSource,
          readOnly: c.readOnly,
        }])),
      })),
      listed: { topic: listedBefore.includes(topic), doomedBefore: listedBefore.includes(doomed),
        doomedAfter: listedAfter.includes(doomed) },
    }
  } finally {
    await admin.disconnect()
  }
})
