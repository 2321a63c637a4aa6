'use strict'
// kafkajs through a secured listener.
//
//   node secure.js BOOTSTRAP TOPIC SETTINGS
//
// SETTINGS is JSON: {"ssl": null | {"ca": PATH, "cert": PATH, "key": PATH},
// "sasl": null | {"mechanism": "plain" | "scram-sha-256" | "scram-sha-512",
// "username", "password"}, "expect": "ok" | "refused"}. "ok": produce three
// records, read them back as a group member, and print them with the broker
// address the cluster advertised. "refused": connecting must fail; print why.
const fs = require('fs')
const { errorInfo, kafka, main, producer, until } = require('./lib')

function kafkaSettings({ ssl, sasl }) {
  const out = {}
  if (ssl) {
    out.ssl = { ca: [fs.readFileSync(ssl.ca, 'utf8')] }
    if (ssl.cert) {
      out.ssl.cert = fs.readFileSync(ssl.cert, 'utf8')
      out.ssl.key = fs.readFileSync(ssl.key, 'utf8')
    }
  }
  if (sasl) out.sasl = sasl
  return out
}

main(async ({ bootstrap, topic, args }) => {
  const settings = JSON.parse(args[0])
  const client = kafka(bootstrap, 'gateway-secure', {
    ...kafkaSettings(settings),
    ...(settings.expect === 'refused' ? { retry: { retries: 0 } } : {}),
  })
  const admin = client.admin()
  if (settings.expect === 'refused') {
    try {
      await admin.connect()
      await admin.listTopics()
    } catch (e) {
      return { refused: true, error: errorInfo(e) }
    } finally {
      await admin.disconnect()
    }
    return { refused: false }
  }
  const prod = producer(client)
  const consumer = client.consumer({ groupId: `${topic}-group`, maxWaitTimeInMs: 500 })
  await admin.connect()
  await prod.connect()
  await consumer.connect()
  try {
    const cluster = await admin.describeCluster()
    await prod.send({ topic, messages: ['one', 'two', 'three'].map(value => ({ value })) })
    const received = []
    await consumer.subscribe({ topic, fromBeginning: true })
    await consumer.run({ eachMessage: async ({ message }) => {
      received.push(message.value.toString('utf8'))
    } })
    await until(() => received.length >= 3, 45000, 'three records')
    return { received, brokers: cluster.brokers.map(b => `${b.host}:${b.port}`) }
  } finally {
    await consumer.disconnect()
    await prod.disconnect()
    await admin.disconnect()
  }
})
