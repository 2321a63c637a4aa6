'use strict'
// Two kafkajs consumers in one group (RoundRobin, kafkajs' default assignor):
// FindCoordinator, JoinGroup, SyncGroup, Heartbeat, OffsetCommit/OffsetFetch,
// LeaveGroup; then the admin's ListGroups, DescribeGroups, fetchOffsets and
// DeleteGroups.
//
//   node group.js BOOTSTRAP TOPIC GROUP PARTITIONS COUNT LATER
//
// The topic has PARTITIONS partitions and holds COUNT records. Both members join and share the partitions;
// together they read the COUNT records (auto-commit after each one is
// processed). Then member "b" leaves (disconnect sends LeaveGroup), member
// "a" is reassigned every partition, LATER more records are produced and "a"
// reads them, resuming from the offsets the group committed.
const { errorInfo, kafka, main, message, producer, until } = require('./lib')

main(async ({ bootstrap, topic, args }) => {
  const [groupId, partitionsArg, countArg, laterArg] = args
  const partitions = Number(partitionsArg)
  const count = Number(countArg)
  const later = Number(laterArg)
  const client = kafka(bootstrap)
  const admin = client.admin()
  const prod = producer(client)
  const members = {}
  let crashed = null

  for (const name of ['a', 'b']) {
    const consumer = kafka(bootstrap, `kafkajs-${name}`).consumer({
      groupId,
      sessionTimeout: 6000,
      heartbeatInterval: 500,
      maxWaitTimeInMs: 500,
      retry: { retries: 5, initialRetryTime: 200, restartOnFailure: async () => false },
    })
    const member = { consumer, received: [], joins: [] }
    consumer.on(consumer.events.CRASH, e => { crashed = e.payload.error })
    consumer.on(consumer.events.GROUP_JOIN, e => { member.joins.push(e.payload) })
    members[name] = member
  }
  const waitFor = (check, what, ms = 45000) => until(() => {
    if (crashed) throw Object.assign(new Error(`consumer crashed: ${crashed.message}`),
      { cause: crashed, info: errorInfo(crashed) })
    return check()
  }, ms, what)
  const partitionsOf = join => Object.values(join.memberAssignment).reduce((n, ps) => n + ps.length, 0)
  const lastJoin = member => member.joins[member.joins.length - 1]

  await admin.connect()
  await prod.connect()
  for (const member of Object.values(members)) {
    await member.consumer.connect()
    await member.consumer.subscribe({ topics: [topic], fromBeginning: true })
    await member.consumer.run({
      eachMessage: async ({ topic: t, partition, message: m }) => {
        member.received.push(message(t, partition, m))
      },
    })
  }
  const result = { groupId }
  try {
    const total = () => members.a.received.length + members.b.received.length
    await waitFor(() => total() >= count, `${count} records`)
    // Both members hold partitions of one generation: between them, all of them.
    await waitFor(() => members.a.joins.length && members.b.joins.length &&
      partitionsOf(lastJoin(members.a)) > 0 && partitionsOf(lastJoin(members.b)) > 0 &&
      partitionsOf(lastJoin(members.a)) + partitionsOf(lastJoin(members.b)) === partitions,
    'both members assigned')
    result.shared = { a: lastJoin(members.a), b: lastJoin(members.b) }
    result.listed = (await admin.listGroups()).groups
    result.described = (await admin.describeGroups([groupId])).groups
      .map(g => ({ groupId: g.groupId, state: g.state, protocol: g.protocol,
        members: g.members.map(m => ({ memberId: m.memberId, clientId: m.clientId })) }))

    await members.b.consumer.disconnect() // LeaveGroup
    await waitFor(() => partitionsOf(lastJoin(members.a)) === partitions, 'the takeover')
    result.takeover = lastJoin(members.a)
    const before = members.a.received.length
    await prod.send({ topic, messages: Array.from({ length: later }, (_, i) => ({ value: `later-${i}` })) })
    await waitFor(() => members.a.received.length >= before + later, `${later} later records`)

    const committedAll = async () => {
      const [offsets] = await admin.fetchOffsets({ groupId, topics: [topic] })
      result.committed = offsets.partitions
        .map(p => ({ partition: p.partition, offset: Number(p.offset), metadata: p.metadata }))
      return result.committed.reduce((n, p) => n + Math.max(p.offset, 0), 0) === count + later
    }
    await waitFor(committedAll, 'every record committed')
    await members.a.consumer.disconnect()
    await admin.deleteGroups([groupId])
    result.afterDelete = (await admin.fetchOffsets({ groupId, topics: [topic] }))[0].partitions
      .map(p => Number(p.offset))
    result.received = { a: members.a.received, b: members.b.received }
    return result
  } finally {
    for (const member of Object.values(members)) await member.consumer.disconnect()
    await prod.disconnect()
    await admin.disconnect()
  }
}, { deadlineMs: 90000 })
