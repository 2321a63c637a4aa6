'use strict'
// describeConfigs / alterConfigs round trip on a topic, plus the broker resource.
// alterConfigs is Kafka's AlterConfigs: the request's set replaces every override.
const { ConfigResourceTypes, errorInfo, kafka, main } = require('./lib')

const NAMES = ['retention.ms', 'retention.bytes', 'max.message.bytes']

main(async ({ bootstrap, topic }) => {
  const admin = kafka(bootstrap).admin()
  await admin.connect()
  try {
    await admin.createTopics({
      waitForLeaders: true,
      topics: [{ topic, configEntries: [{ name: 'retention.ms', value: '3600000' }] }],
    })
    const resource = { type: ConfigResourceTypes.TOPIC, name: topic }
    const describe = async () => {
      const { resources: [r] } = await admin.describeConfigs({
        includeSynonyms: false, resources: [{ ...resource, configNames: NAMES }],
      })
      return Object.fromEntries(r.configEntries.map(c => [c.configName,
        { value: c.configValue, isDefault: c.isDefault, source: c.configSource }]))
    }
    const alter = (entries, validateOnly = false) => admin.alterConfigs({
      validateOnly, resources: [{ ...resource, configEntries: entries }],
    })

    const initial = await describe()
    const altered = await alter([
      { name: 'retention.bytes', value: '1048576' },
      { name: 'max.message.bytes', value: '500000' },
    ])
    const afterAlter = await describe()
    await alter([{ name: 'retention.bytes', value: '2048' }], true)
    const afterValidateOnly = await describe()

    let invalid = null
    try {
      await alter([{ name: 'retention.ms', value: 'not-a-number' }])
    } catch (e) {
      invalid = errorInfo(e)
    }
    const afterInvalid = await describe()

    const { resources: [broker] } = await admin.describeConfigs({
      includeSynonyms: false,
      resources: [{ type: ConfigResourceTypes.BROKER, name: '0',
        configNames: ['num.partitions', 'auto.create.topics.enable'] }],
    })
    return {
      initial,
      altered: altered.resources.map(r => ({ errorCode: r.errorCode, name: r.resourceName })),
      afterAlter,
      afterValidateOnly,
      invalid,
      afterInvalid,
      broker: {
        errorCode: broker.errorCode,
        entries: Object.fromEntries(broker.configEntries.map(c => [c.configName,
          { value: c.configValue, readOnly: c.readOnly }])),
      },
    }
  } finally {
    await admin.disconnect()
  }
})
