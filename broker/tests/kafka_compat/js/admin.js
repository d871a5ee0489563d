// kafkajs' admin against sluiced, driven by test_admin.py. Settings come from the
// environment: BOOTSTRAP, KAFKA_USER, KAFKA_PASSWORD, TOPIC, GROUP, and MODE:
// - "flow": a consumer in GROUP reads TOPIC and commits; the admin calls listGroups,
//   describeGroups (while it is a member, then after it left), fetchOffsets, createPartitions,
//   deleteGroups; every answer is printed as one JSON object on the last line.
// - "look": what this account sees: listTopics, listGroups, describeGroups([GROUP]).
'use strict';
const { Kafka, logLevel } = require('kafkajs');

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};

const kafka = new Kafka({
  clientId: 'sluice-kafkajs-admin-test',
  brokers: [env('BOOTSTRAP')],
  sasl: { mechanism: 'plain', username: env('KAFKA_USER'), password: env('KAFKA_PASSWORD') },
  logLevel: logLevel.ERROR,
  retry: { retries: 3 },
});

async function flow(topic, group) {
  const out = {};
  const admin = kafka.admin();
  await admin.connect();
  const producer = kafka.producer();
  await producer.connect();
  await producer.send({
    topic,
    messages: Array.from({ length: 6 }, (_, i) => ({ value: `v${i}`, partition: 0 })),
  });
  await producer.disconnect();

  const consumer = kafka.consumer({ groupId: group, sessionTimeout: 10000 });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  let seen = 0;
  const done = new Promise((resolve) => {
    consumer.run({
      autoCommit: false,
      eachMessage: async ({ topic: t, partition, message }) => {
        seen += 1;
        await consumer.commitOffsets([
          { topic: t, partition, offset: (BigInt(message.offset) + 1n).toString() },
        ]);
        if (seen === 6) resolve();
      },
    });
  });
  await Promise.race([done, new Promise((_, no) => setTimeout(() => no(new Error(`consumed ${seen} of 6`)), 60000))]);
  out.consumed = seen;
  out.listed = (await admin.listGroups()).groups;
  out.describedActive = (await admin.describeGroups([group])).groups;
  await consumer.disconnect();
  out.describedAfter = (await admin.describeGroups([group])).groups;
  out.offsets = await admin.fetchOffsets({ groupId: group, topics: [topic] });
  out.created = await admin.createPartitions({ topicPartitions: [{ topic, count: 4 }] });
  const meta = await admin.fetchTopicMetadata({ topics: [topic] });
  out.partitions = meta.topics[0].partitions.length;
  out.deleted = await admin.deleteGroups([group]);
  out.listedAfterDelete = (await admin.listGroups()).groups;
  await admin.disconnect();
  return out;
}

async function look(group) {
  const admin = kafka.admin();
  await admin.connect();
  const out = {
    topics: await admin.listTopics(),
    groups: (await admin.listGroups()).groups,
    described: (await admin.describeGroups([group])).groups,
  };
  await admin.disconnect();
  return out;
}

(async () => {
  const mode = env('MODE');
  const out = mode === 'flow' ? await flow(env('TOPIC'), env('GROUP')) : await look(env('GROUP'));
  process.stdout.write(`${JSON.stringify(out)}\n`);
})().catch((e) => {
  process.stderr.write(`${e.stack || e}\n`);
  process.exit(1);
});
